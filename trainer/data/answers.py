"""Answer extraction for evaluation sets (`eval.sets[].extract`): what a response answered, and
whether it is the row's answer.

  last_number  what follows '####' if any, else the last number (GSM8K's convention; the
               arithmetic task's own scoring)
  boxed        the content of the last \\boxed{...} (nested braces allowed)
  exact        the whole response, stripped
  regex:P      the first group of P's last match (the whole match when P has no group)

Two answers are the same when both read as numbers of equal value (1,000 = 1000 = 1000.0), else
when their stripped, case-folded texts are equal. A response with nothing to extract is wrong.
"""

from __future__ import annotations

import re

from hflow.trainer.data.tasks import NUMBER, final_answer

def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract(rule: str, text: str) -> str | None:
    """The answer `text` gives under `rule` (not `reward`), or None when there is none."""
    if rule == "last_number":
        return final_answer(text) if ("####" in text or NUMBER.search(text)) else None
    if rule == "boxed":
        return _boxed(text)
    if rule == "exact":
        return text.strip()
    matches = list(re.finditer(rule[len("regex:"):], text))
    if not matches:
        return None
    last = matches[-1]
    return last.group(1) if last.re.groups else last.group(0)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def same_answer(got: str | None, want) -> bool:
    """Whether the extracted `got` is the answer `want` (see the module docstring)."""
    if got is None or want is None:
        return False
    want = str(want)
    a, b = _number(got), _number(want)
    if a is not None and b is not None:
        return a == b
    return got.strip().casefold() == want.strip().casefold()


def is_right(rule: str, response: str, answer) -> bool:
    return same_answer(extract(rule, response), answer)
