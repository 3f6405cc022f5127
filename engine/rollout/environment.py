"""The environment a multi-turn episode runs against (`rollout.env: module:Class`).

A user writes a class with two methods; a fresh instance plays each episode:

    class MyEnv:
        tools = [add]                       # optional: functions advertised to the chat template
        def reset(self, row: dict) -> list[dict] | None:
            '''The episode's first messages, from the data row (None: the row's own prompt).'''
        def step(self, assistant_text: str) -> tuple[list[dict], float, bool]:
            '''The assistant's turn in; the observation messages, this turn's reward, done.'''

`engine/rollout/tools.py` has `ToolEnv`, a base class that runs tool calls for `step`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hflow.engine.user_code import import_named
from hflow.errors import UserError

KEY = "rollout.env"


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits (the recipe's `rollout` keys): turns, tokens of the whole response
    (sampled and observation tokens: `max_response_length`), tokens of one sampled turn,
    seconds, and the per-turn discount."""

    max_turns: int
    max_tokens: int
    timeout_s: float
    discount: float = 1.0
    max_turn_tokens: int | None = None  # None: max_tokens
    max_prompt_tokens: int | None = None  # the first messages' tokens (`data.max_prompt_length`); None: any


def load_env_class(spec: str, key: str = KEY) -> type:
    """The class `module:Class` names, checked to have `reset` and `step`; a UserError otherwise."""
    cls = import_named(spec, key, "module:Class")
    module_name, _, attr = spec.rpartition(":")
    if not isinstance(cls, type):
        raise UserError(f"{key} {spec!r}: module {module_name!r} has no class {attr!r}")
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise UserError(f"{key} {spec!r}: class {attr!r} has no {' or '.join(missing)} method "
                        "(an environment needs reset(row) and step(assistant_text))")
    return cls


def checked_step(result, spec: str) -> tuple[list[dict], float, bool]:
    """`env.step`'s result as (messages, reward, done), or a UserError saying what was wrong."""
    if not (isinstance(result, tuple) and len(result) == 3):
        raise UserError(f"{KEY} {spec!r}: step() must return (observation messages, reward, done), "
                        f"got {type(result).__name__}")
    messages, reward, done = result
    messages = [] if messages is None else messages
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise UserError(f"{KEY} {spec!r}: step()'s observation must be a list of chat messages "
                        "({'role': ..., 'content': ...})")
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise UserError(f"{KEY} {spec!r}: step()'s reward {reward!r} is not a number") from None
    if not math.isfinite(reward):
        raise UserError(f"{KEY} {spec!r}: step()'s reward is {reward}; it must be finite")
    return messages, reward, bool(done)


def discounted_return(rewards: list[float], discount: float) -> float:
    """sum_t discount^t * r_t over the turns' rewards (discount 1: their sum)."""
    return float(sum(r * discount ** t for t, r in enumerate(rewards)))
