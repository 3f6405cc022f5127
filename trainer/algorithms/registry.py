"""The RL algorithms hflow trains, by the recipe's `algorithm` name."""

from __future__ import annotations

from typing import Callable

from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.writer import RunDir


def trainer_for(algorithm: str) -> Callable[[Recipe, RunDir], None]:
    from hflow.trainer.algorithms import grpo, ppo, remax, safe_rlhf

    available = {"grpo": grpo.train, "ppo": ppo.train, "remax": remax.train, "safe_rlhf": safe_rlhf.train}
    if algorithm not in available:
        raise UserError(f"algorithm {algorithm!r} cannot be trained by this version of hflow yet; "
                        f"available: {', '.join(available)}")
    return available[algorithm]
