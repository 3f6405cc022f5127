"""Arithmetic with a calculator tool, for a real chat model (`recipes/grpo/smollm2-calculator.yaml`).

The rows are `synthetic:multiply` problems ("What is 47 * 86? Answer with a number."): two-digit
products, which SmolLM2-135M-Instruct gets right in its head about one time in fifty, and a
calculator always. The system message describes the calculator and the Hermes call format, since
SmolLM2's chat template does not render `tools`, and one worked exchange shows it used. An episode:

    system: ... <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call> ...
    user: What is 23 * 17? ...  assistant: <tool_call>...</tool_call>  tool: 391  assistant: 391
    user: What is 47 * 86? Answer with a number.
    assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "47 * 86"}}</tool_call>
    tool: 4042
    assistant: 4042

A turn without a call is the final answer: 1.0 when its last number is the answer (the
`arithmetic` score), else 0. No reward for calling the tool: only right answers pay, so the
policy learns to call because calling is how it gets them right.
"""

from __future__ import annotations

import ast
import operator

from hflow.engine.rollout.tools import ToolEnv
from hflow.trainer.data.tasks import score_arithmetic

SYSTEM = (
    "You can use a calculator. To use it, reply with exactly one line such as\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>\n'
    "and you will get the result. Then reply with the final answer, a number."
)

EXAMPLE = [
    {"role": "user", "content": "What is 23 * 17? Answer with a number."},
    {"role": "assistant",
     "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "23 * 17"}}</tool_call>'},
    {"role": "tool", "content": "391"},
    {"role": "assistant", "content": "391"},
]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with +, - and *.

    expression: the expression, e.g. 12 * 7
    """
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only integers with +, - and * are supported")

    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    return str(value(ast.parse(expression, mode="eval").body))


class ArithmeticToolEnv(ToolEnv):
    tools = [calculator]
    tool_timeout_s = 30.0  # it takes microseconds: a short limit could cut it on a loaded machine
    max_output_chars = 200

    def reset(self, row: dict) -> list[dict]:
        self.answer = str(row["answer"])
        return [{"role": "system", "content": SYSTEM}, *EXAMPLE, *row["prompt"]]

    def score(self, answer: str) -> float:
        return score_arithmetic(answer, self.answer)
