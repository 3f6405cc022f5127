"""A calculator tool environment small enough for the tiny character-level model to learn on a CPU
(`recipes/grpo/tiny_calculator.yaml`).

The data rows are `synthetic:calc` problems ("calc 7*8"); the answer is the product's last digit,
which the model cannot work out but the calculator can. An episode:

    user: calc 7*8
    assistant: =            <- a turn with "=" in it calls the calculator on the problem
    tool: 6
    assistant: 66666666     <- a turn without "=" is the final answer

The tiny tokenizer has no "<", ">", "{" or "}", so the model cannot write the Hermes
`<tool_call>{...}</tool_call>` a real model would (`ToolEnv`'s default parser): here the call is
the "=" sign, and its argument is the problem of the prompt. The calculator answers once: the
turn after it is the answer, "=" or not. Rewards per turn: `call_reward` for the turn that calls
the tool (a format reward, as in tool-use RL recipes), and the answer's score over its first 8
characters: 1 for each that is the right digit, `digit_credit` for another digit, over 8.
"""

from __future__ import annotations

import re

from hflow.engine.rollout.tools import ToolCall, ToolEnv


def calculator(expression: str) -> str:
    """Evaluate a product of two integers and give its last digit.

    expression: two integers joined by '*', e.g. 7*8
    """
    a, b = (int(x) for x in re.fullmatch(r"\s*(\d+)\s*\*\s*(\d+)\s*", expression).groups())
    return str(a * b % 10)


class CalculatorEnv(ToolEnv):
    tools = [calculator]
    tool_timeout_s = 30.0  # it takes microseconds: a short limit could cut it on a loaded machine
    call_reward = 0.2  # for the first turn that calls the calculator

    def reset(self, row: dict) -> list[dict]:
        self.problem = str(row["prompt"]).removeprefix("calc ").strip()
        self.answer = str(row["answer"])
        return [{"role": "user", "content": str(row["prompt"])}]

    digit_credit = 0.25  # for a digit that is not the answer's

    def parse_calls(self, text: str) -> list[ToolCall]:
        called = "=" in text and self.tool_calls == 0
        return [ToolCall("calculator", {"expression": self.problem})] if called else []

    def score(self, answer: str) -> float:
        head = answer[:8]
        return sum(1.0 if c == self.answer else self.digit_credit if c.isdigit() else 0.0 for c in head) / 8

    def step(self, assistant_text: str) -> tuple[list[dict], float, bool]:
        first_call = self.tool_calls == 0
        messages, reward, done = super().step(assistant_text)
        if not done and first_call:
            reward += self.call_reward
        return messages, reward, done
