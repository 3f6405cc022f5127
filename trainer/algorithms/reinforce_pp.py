"""REINFORCE++ and REINFORCE++-baseline as single-controller programs (Hu et al. 2025,
arXiv 2501.03262).

GRPO's loop (`grpo.run_outcome_loop`) with REINFORCE-style advantages and no critic:
- `reinforce_pp`: the KL to the reference charged per token in the reward (`token_rewards`),
  the discounted reward-to-go, whitened over every response token of the step;
- `reinforce_pp_baseline`: each score minus its prompt's mean score, whitened over the
  step; the KL goes into the actor's loss (k2 by default).
"""

from __future__ import annotations

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.rlmath import advantages
from hflow.engine.rlmath.kl import kl_in_reward
from hflow.trainer.algorithms.grpo import run_outcome_loop
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.writer import RunDir


def train(recipe: Recipe, run: RunDir) -> None:
    baseline = recipe.algorithm == "reinforce_pp_baseline"
    run_outcome_loop(recipe, run, compute_baseline_advantages if baseline else compute_advantages)


def compute_advantages(batch: Batch, recipe: Recipe) -> Batch:
    """Token rewards (score on the last token, -beta x KL on each), reward-to-go, whitened."""
    mask = batch[col.RESPONSE_MASK]
    kl = kl_in_reward(batch, recipe.kl)
    rewards = advantages.token_rewards(batch[col.SCORES], mask, kl, recipe.kl.coef)
    adv, returns = advantages.reinforce_plus_plus(rewards, mask, recipe.reinforce_pp.gamma)
    return Batch({col.TOKEN_REWARDS: rewards, col.ADVANTAGES: adv, col.RETURNS: returns})


def compute_baseline_advantages(batch: Batch, recipe: Recipe) -> Batch:
    """Scores centred on their prompt's mean, on every response token, whitened over the step."""
    adv = advantages.reinforce_plus_plus_baseline(batch[col.SCORES], batch[col.UID], batch[col.RESPONSE_MASK])
    return Batch({col.ADVANTAGES: adv})
