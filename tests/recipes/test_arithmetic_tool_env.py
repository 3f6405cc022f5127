"""The shipped arithmetic calculator environment (`recipes/grpo/smollm2-calculator.yaml`), by hand."""

import json

from hflow.recipes.envs.arithmetic_tool import EXAMPLE, SYSTEM, ArithmeticToolEnv, calculator

ROW = {"prompt": [{"role": "user", "content": "What is 12 * 7? Answer with a number."}], "answer": "84"}


def _call(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


def test_the_calculator_evaluates_integer_arithmetic_and_nothing_else():
    assert calculator("12 * 7") == "84" and calculator("3 - 30") == "-27" and calculator("-2 * (4 + 1)") == "-10"
    for bad in ("__import__('os').system('true')", "2 ** 100", "1 / 2", "x + 1"):
        try:
            calculator(bad)
        except (ValueError, SyntaxError):
            continue
        raise AssertionError(f"{bad!r} was evaluated")


def test_an_episode_a_call_then_the_answer():
    env = ArithmeticToolEnv()
    assert env.reset(ROW) == [{"role": "system", "content": SYSTEM}, *EXAMPLE, *ROW["prompt"]]
    assert env.step(_call("12 * 7")) == ([{"role": "tool", "content": "84"}], 0.0, False)
    assert env.step("The answer is 84") == ([], 1.0, True)
    assert env.tool_calls == 1


def test_only_a_right_final_answer_pays():
    env = ArithmeticToolEnv()
    env.reset(ROW)
    assert env.step("12 * 7 = 74") == ([], 0.0, True) and env.tool_calls == 0
    env = ArithmeticToolEnv()
    env.reset(ROW)
    messages, reward, done = env.step(_call("12 ** 7"))  # the tool's error is the observation
    assert reward == 0.0 and not done and "error" in messages[0]["content"].lower()


def test_multiply_problems_need_two_digits_and_split_disjointly():
    from hflow.trainer.data import tasks

    train, held = set(tasks.multiply_problems("train")), set(tasks.multiply_problems("eval"))
    assert train and held and not train & held
    assert all(11 <= a <= 99 and 11 <= b <= 99 and op == "*" for a, op, b in train | held)
    row = tasks.make_rows("multiply", 1, seed=3, split="eval")[0]
    a, b = (int(x) for x in row["prompt"][0]["content"].removeprefix("What is ").split("?")[0].split(" * "))
    assert (a, "*", b) in held and row["answer"] == str(a * b)
