"""The RL algorithms hflow trains, by the recipe's `algorithm` name (the table: `roles.py`)."""

from __future__ import annotations

import importlib
from typing import Callable

from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.algorithm_sections import ALGORITHMS
from hflow.trainer.rundir.writer import RunDir


def trainer_for(algorithm: str) -> Callable[[Recipe, RunDir], None]:
    """The `train(recipe, run)` of `algorithm`'s program."""
    if algorithm not in ALGORITHMS:
        raise UserError(f"algorithm {algorithm!r} cannot be trained by this version of hflow yet; "
                        f"available: {', '.join(ALGORITHMS)}")
    # Imported on demand: the programs import the session and its engine, which `hflow validate` never needs.
    return importlib.import_module(ALGORITHMS[algorithm].program).train
