"""Reward (and cost) functions: built-ins by name, or any `module:function` a recipe names.

A reward function is called once per batch as
    fn(prompts: list[str], responses: list[str], **columns) -> list[float]
where `columns` are the data set's other columns (answer, task, ...), one entry per
response. Scores are floats; the built-ins return values in [0, 1]. Safe-RLHF's
`cost.function` is loaded the same way (a higher cost is less safe).
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from hflow.engine.user_code import import_named, registered
from hflow.errors import UserError
from hflow.trainer import reward_defaults
from hflow.trainer.data import tasks

RewardFn = Callable[..., list[float]]
_final_answer = tasks.final_answer


def synthetic(prompts: list[str], responses: list[str], task: list[str], answer: list[str],
              **_) -> list[float]:
    """The score of each row's built-in synthetic task (see `hflow.trainer.data.tasks`)."""
    return [tasks.score(t, r, a) for t, r, a in zip(task, responses, answer)]


def exact_match(prompts: list[str], responses: list[str], answer: list[str], **_) -> list[float]:
    """1.0 when the response's final answer equals the `answer` column's, else 0.0."""
    return [float(_final_answer(r) == _final_answer(str(a))) for r, a in zip(responses, answer)]


def format_match(prompts: list[str], responses: list[str], pattern: str, **_) -> list[float]:
    """1.0 when the regular expression `pattern` (`reward.format_pattern`) is found in the response."""
    compiled = re.compile(pattern)
    return [float(compiled.search(r) is not None) for r in responses]


def length(prompts: list[str], responses: list[str], target: int, **_) -> list[float]:
    """max(0, 1 - |characters - target| / target): 1.0 at `reward.target_length` characters."""
    return [max(0.0, 1.0 - abs(len(r) - target) / target) for r in responses]


def synthetic_cost(prompts: list[str], responses: list[str], **_) -> list[float]:
    """A stand-in for 'unsafe content' in the CPU recipes: the share of the first 8 response
    characters that are high digits (5-9), in [0, 1]. The `digits` task's reward tempts the
    policy into digits; the constraint asks it to keep to 0-4."""
    return [tasks.high_digit_share(r) for r in responses]


def env_return(prompts: list[str], responses: list[str], episode: list[dict], **_) -> list[float]:
    """The return of each row's multi-turn episode (`rollout.env`): its turns' rewards, summed
    or discounted by `rollout.turn_discount` (`engine/rollout/episodes.py`)."""
    return [float(e["return"]) for e in episode]


BUILTINS: dict[str, RewardFn] = {
    "synthetic": synthetic,
    "exact_match": exact_match,
    "format": format_match,
    "length": length,
    "synthetic_cost": synthetic_cost,
    "env": env_return,
}

# The data columns each built-in reads besides the prompt: checked in every row before a run
# starts (`row_checks.py`). A `module:function` may read any column: nothing can be checked.
COLUMNS_READ: dict[str, tuple[str, ...]] = {"synthetic": ("task", "answer"), "exact_match": ("answer",)}


def load_reward_fn(spec: str, key: str = "reward.function", cfg=None) -> RewardFn:
    """A built-in name or `module:function` (`engine/user_code.py`: a module on the import path or a
    .py file by its path). `key` names the
    recipe key in errors; `cfg` (the recipe's `reward` section) gives `format` its pattern and
    `length` its target."""
    if spec == "format":
        pattern = cfg.format_pattern if cfg is not None else reward_defaults.FORMAT_PATTERN
        try:
            re.compile(pattern)
        except re.error as err:
            raise UserError(f"reward.format_pattern {pattern!r}: not a valid regular expression ({err})") from None
        return functools.partial(format_match, pattern=pattern)
    if spec == "length":
        target = cfg.target_length if cfg is not None else reward_defaults.TARGET_LENGTH
        return functools.partial(length, target=target)
    if spec in BUILTINS:
        return BUILTINS[spec]
    if ":" not in spec:
        raise UserError(f"{key} {spec!r}: not a built-in ({', '.join(BUILTINS)}) "
                        "and not of the form module:function")
    fn = registered(spec, key) or import_named(spec, key, "module:function")
    if not callable(fn):
        module_name, _, attr = spec.rpartition(":")
        raise UserError(f"{key} {spec!r}: module {module_name!r} has no function {attr!r}")
    return fn
