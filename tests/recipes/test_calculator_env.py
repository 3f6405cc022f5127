"""The shipped calculator environment and its `synthetic:calc` task, by hand."""

from hflow.recipes.envs.calculator import CalculatorEnv, calculator
from hflow.trainer.data.rewards import env_return
from hflow.trainer.data.tasks import make_rows


def test_calc_rows_hold_the_product_s_last_digit():
    for row in make_rows("calc", 20, seed=1):
        a, b = map(int, row["prompt"].removeprefix("calc ").split("*"))
        assert row["answer"] == str(a * b % 10) == calculator(f"{a}*{b}")


def test_a_call_then_the_answer():
    env = CalculatorEnv()
    assert env.reset({"prompt": "calc 7*8", "answer": "6"}) == [{"role": "user", "content": "calc 7*8"}]
    assert env.step("ab=") == ([{"role": "tool", "content": "6"}], 0.2, False)
    # After the calculator has answered, the next turn is the answer, "=" or not.
    assert env.step("666=6a66") == ([], (6 + 0) / 8, True)
    assert env.tool_calls == 1


def test_an_answer_without_the_tool_gets_partial_credit_for_digits():
    env = CalculatorEnv()
    env.reset({"prompt": "calc 7*8", "answer": "6"})
    assert env.step("61xx") == ([], (1 + 0.25) / 8, True) and env.tool_calls == 0


def test_the_env_reward_is_the_episode_return():
    assert env_return(["p", "q"], ["a", "b"], episode=[{"return": 0.5}, {"return": 1.25}]) == [0.5, 1.25]
