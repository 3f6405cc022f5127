"""Built-in synthetic prompt tasks, generated locally from a seed (no data set download).

Each task makes rows {prompt, answer, task} and scores responses in [0, 1]. They are
small enough for a tiny model trained from scratch on a CPU to learn within minutes,
which is what the quickstart and the end-to-end tests need.

  digits  "write digits: " -> reward = share of the first 8 response characters that are digits
  letter  "say q: "        -> reward = share of the first 8 response characters equal to the letter
  echo    "echo abc: "     -> reward = share of the answer's characters reproduced in place
  calc    "calc 7*8"       -> the last digit of the product, only known through a calculator tool:
          reward = share of the first 8 response characters equal to it (`rollout.env` recipes,
          `recipes/envs/calculator.py`)
  arithmetic  chat: "What is 12 + 7? Answer with a number." -> 1.0 when the response's last
          number is the result, else 0.0 (for a real instruct model, e.g. SmolLM2-135M-Instruct)
  arithmetic_rephrased, arithmetic_wide  held-out variants of arithmetic, for evaluation only:
          its held-out problems in instructions it never trains on ("Calculate 12 plus 7. Reply
          with the result only."), and problems with operands outside its ranges (31..99; 2..9 x 13..25)
  multiply_wide  multiply's held-out variant for evaluation only: a three-digit times a two-digit
          number (100..999 x 11..99), outside its training range
  multiply  chat: "What is 47 * 86? Answer with a number." (two-digit operands), scored as
          arithmetic: beyond a 135M model's mental arithmetic, within reach of a calculator tool
          (`recipes/envs/arithmetic_tool.py`)

`arithmetic` and `multiply` draw from fixed sets of problems split once into train and held-out
parts by a hash of the problem, so `data.train` and `data.eval` of one never share a problem.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from typing import Callable

TARGET_LENGTH = 8
_WORDS = ["write", "give", "print", "show", "type", "list", "make", "send"]


def _digits(rng: random.Random) -> dict:
    return {"prompt": f"{rng.choice(_WORDS)} digits: ", "answer": ""}


def _letter(rng: random.Random) -> dict:
    letter = rng.choice(string.ascii_lowercase)
    return {"prompt": f"say {letter}: ", "answer": letter}


def _echo(rng: random.Random) -> dict:
    word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 4)))
    return {"prompt": f"echo {word}: ", "answer": word}


def _calc(rng: random.Random) -> dict:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return {"prompt": f"calc {a}*{b}", "answer": str(a * b % 10)}


def _share(response: str, keep: Callable[[int, str], bool]) -> float:
    head = response[:TARGET_LENGTH]
    return sum(keep(i, c) for i, c in enumerate(head)) / TARGET_LENGTH


def score_digits(response: str, answer: str) -> float:
    return _share(response, lambda _, c: c.isdigit())


def high_digit_share(response: str) -> float:
    """Share of the first TARGET_LENGTH characters that are the digits 5-9 (`synthetic_cost`)."""
    return _share(response, lambda _, c: c in "56789")


def score_letter(response: str, answer: str) -> float:
    return _share(response, lambda _, c: c == answer)


def score_echo(response: str, answer: str) -> float:
    return sum(a == b for a, b in zip(response, answer)) / max(1, len(answer))


# The number pattern and final-answer rule of the `exact_match` reward too (`rewards.py`).
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def final_answer(text: str) -> str:
    """GSM8K style: what follows '####', else the last number, else the stripped text."""
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else text.strip()


# Arithmetic problems: a + b and a - b with operands 1..30 (a >= b for -, so no negative results),
# and a * b with a in 2..9, b in 2..12. SmolLM2-135M-Instruct answers about a quarter of the held-out
# ones right greedily within 16 tokens (two-digit operands 10..99: under a tenth), room to learn.
EVAL_SHARE = 4  # one problem in EVAL_SHARE is held out


def _problems() -> list[tuple[int, str, int]]:
    out = [(a, op, b) for a in range(1, 31) for b in range(1, 31) for op in "+-" if op == "+" or a >= b]
    return out + [(a, "*", b) for a in range(2, 10) for b in range(2, 13)]


def is_held_out(a: int, op: str, b: int) -> bool:
    """The split of a problem: a hash of its text, so it never changes with the seed or the size."""
    return hashlib.sha256(f"{a}{op}{b}".encode()).digest()[0] % EVAL_SHARE == 0


_SPLITS: dict[tuple[str, str], list[tuple[int, str, int]]] = {}


def _split(name: str, make: Callable[[], list[tuple[int, str, int]]], split: str) -> list[tuple[int, str, int]]:
    if (name, split) not in _SPLITS:
        problems = make()
        _SPLITS[name, "train"] = [p for p in problems if not is_held_out(*p)]
        _SPLITS[name, "eval"] = [p for p in problems if is_held_out(*p)]
    return _SPLITS[name, split]


def arithmetic_problems(split: str) -> list[tuple[int, str, int]]:
    """Every `arithmetic` problem of `split` (train or eval), in a fixed order."""
    return _split("arithmetic", _problems, split)


def multiply_problems(split: str) -> list[tuple[int, str, int]]:
    """Every `multiply` problem of `split`: a * b with a and b in 11..99 (b not a multiple of 10)."""
    return _split("multiply", lambda: [(a, "*", b) for a in range(11, 100) for b in range(11, 100) if b % 10], split)


def wide_problems(split: str) -> list[tuple[int, str, int]]:
    """`arithmetic_wide`: operands outside `arithmetic`'s ranges (+ and - on 31..99, a * b with a in
    2..9 and b in 13..25), so never a training problem; all of them held out (train: none)."""
    if split != "eval":
        return []
    wide = [(a, op, b) for a in range(31, 100) for b in range(31, 100) for op in "+-" if op == "+" or a >= b]
    return wide + [(a, "*", b) for a in range(2, 10) for b in range(13, 26)]


def multiply_wide_problems(split: str) -> list[tuple[int, str, int]]:
    """`multiply_wide`: a * b with a in 100..999 and b in 11..99 (b not a multiple of 10), outside
    `multiply`'s two-digit range, so never a training problem; all of them held out."""
    return [] if split != "eval" else [(a, "*", b) for a in range(100, 1000) for b in range(11, 100) if b % 10]


def _arithmetic_row(problem: tuple[int, str, int]) -> dict:
    a, op, b = problem
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    question = f"What is {a} {op} {b}? Answer with a number."
    return {"prompt": [{"role": "user", "content": question}], "answer": str(result), "question": f"{a} {op} {b}"}


# `arithmetic_rephrased`: the held-out problems asked in words `arithmetic` never trains on, one
# phrasing per problem (picked by a hash of the problem, so fixed).
_OP_WORDS = {"+": ("add", "{a} and {b}", "plus", "sum"), "-": ("subtract", "{b} from {a}", "minus", "difference"),
             "*": ("multiply", "{a} by {b}", "times", "product")}
REPHRASED = (
    lambda a, op, b, w: f"Calculate {a} {w[2]} {b}. Reply with the result only.",
    lambda a, op, b, w: f"{a} {op} {b} = ?",
    lambda a, op, b, w: f"If you {w[0]} {w[1].format(a=a, b=b)}, what number do you get?",
    lambda a, op, b, w: f"Compute the {w[3]}: {a} {op} {b}",
    lambda a, op, b, w: f"Solve {a} {op} {b} and give the final number.",
)


def _rephrased_row(problem: tuple[int, str, int]) -> dict:
    a, op, b = problem
    phrase = REPHRASED[hashlib.sha256(f"{a}{op}{b}".encode()).digest()[1] % len(REPHRASED)]
    row = _arithmetic_row(problem)
    return {**row, "prompt": [{"role": "user", "content": phrase(a, op, b, _OP_WORDS[op])}]}


def score_arithmetic(response: str, answer: str) -> float:
    return float(final_answer(response) == answer)


TASKS: dict[str, tuple[Callable[[random.Random], dict], Callable[[str, str], float]]] = {
    "digits": (_digits, score_digits),
    "letter": (_letter, score_letter),
    "echo": (_echo, score_echo),
    "calc": (_calc, score_letter),
    "arithmetic": (lambda rng: _arithmetic_row(rng.choice(arithmetic_problems("train"))), score_arithmetic),
    "multiply": (lambda rng: _arithmetic_row(rng.choice(multiply_problems("train"))), score_arithmetic),
    "arithmetic_rephrased": (None, score_arithmetic),  # held-out sets only (EVAL_ONLY)
    "arithmetic_wide": (None, score_arithmetic),
    "multiply_wide": (None, score_arithmetic),
}
# Held-out variants, for evaluation only (never data.train).
EVAL_ONLY = {"arithmetic_rephrased", "arithmetic_wide", "multiply_wide"}
# Tasks with a held-out split: task -> (its problems of a split, a problem's row). Their prompts
# are chat messages for a real instruct model; the other tasks are text, for the tiny models.
SPLIT_TASKS = {"arithmetic": (arithmetic_problems, _arithmetic_row), "multiply": (multiply_problems, _arithmetic_row),
               "arithmetic_rephrased": (arithmetic_problems, _rephrased_row),
               "arithmetic_wide": (wide_problems, _arithmetic_row),
               "multiply_wide": (multiply_wide_problems, _arithmetic_row)}


def make_rows(task: str, size: int, seed: int, split: str = "train") -> list[dict]:
    """`size` seeded rows of `task`. With split `eval`, a task with a held-out split gives
    distinct held-out problems (at most all of them); the other tasks a seeded draw as for train."""
    make, _ = TASKS[task]
    if make is None and split != "eval":
        raise ValueError(f"task {task} has held-out rows only")
    rng = random.Random(seed)
    if split == "eval" and task in SPLIT_TASKS:
        problems, row = SPLIT_TASKS[task]
        pool = problems("eval")
        return [{**row(p), "task": task} for p in rng.sample(pool, min(size, len(pool)))]
    return [{**make(rng), "task": task} for _ in range(size)]


def score(task: str, response: str, answer: str) -> float:
    return TASKS[task][1](response, answer)
