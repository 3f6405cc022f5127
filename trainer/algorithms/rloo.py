"""RLOO as a single-controller program (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740).

GRPO's loop (`grpo.run_outcome_loop`): n responses per prompt, one reward each; a response's
advantage is its reward minus the mean reward of the prompt's other n - 1 responses
(`advantages.rloo`), with the summed KL to the reference charged to the reward first
(`rloo.kl_in_reward`, as the paper and TRL). No critic.
"""

from __future__ import annotations

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.rlmath import advantages
from hflow.trainer.algorithms.grpo import kl_charged_scores, run_outcome_loop
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.writer import RunDir


def train(recipe: Recipe, run: RunDir) -> None:
    run_outcome_loop(recipe, run, compute_advantages)


def compute_advantages(batch: Batch, recipe: Recipe) -> Batch:
    """(B,) leave-one-out advantages of the (KL-charged) scores, one per response."""
    return Batch({col.ADVANTAGES: advantages.rloo(kl_charged_scores(batch, recipe), batch[col.UID])})
