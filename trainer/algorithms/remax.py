"""ReMax as a single-controller program (Li et al. 2023, arXiv 2310.10505).

REINFORCE with a variance-reducing baseline that costs one generation: each prompt is
also answered greedily, and a sampled response's advantage is its reward minus the
greedy response's reward (Algorithm 1). No critic. The KL to the frozen reference is
charged per token in the reward (the paper) or added to the loss (`remax.kl_in_reward`).
"""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.rlmath import advantages
from hflow.engine.rlmath.kl import kl_in_reward
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.session import Session
from hflow.trainer.rundir.writer import RunDir


def train(recipe: Recipe, run: RunDir) -> None:
    roles = recipe.algorithm_spec.roles_for(recipe.uses_reference)
    with Session(recipe, run, roles) as session:
        session.init_workers()
        actor, reward = session.groups["actor"], session.groups["reward"]

        for step in session.steps():
            prompts = session.prompts(step)
            with session.stage("generate"):
                batch = actor.generate_sequences(prompts)
            with session.stage("generate_greedy"):
                greedy_prompts = Batch(prompts.tensors, prompts.columns, prompts.meta | {"greedy": True})
                greedy = actor.generate_sequences(greedy_prompts)
            batch = session.old_log_probs(batch)
            batch = session.reference_log_probs(batch)
            with session.stage("reward"):
                batch |= reward.compute_reward(batch)
                baseline = reward.compute_reward(greedy)[col.SCORES]
            if not session.finite_scores(batch, step, baseline):  # a NaN/inf score, trainer.on_nonfinite: skip_step
                session.end_step(step, batch)  # logged, with no update
                continue
            with session.stage("advantage"):
                batch |= compute_advantages(batch, baseline, recipe)
            with session.stage("update_actor"):
                metrics = actor.update_actor(batch)
            session.end_step(step, batch, metrics, {"reward/baseline_mean": float(baseline.mean())})
        session.finish()


def compute_advantages(batch: Batch, baseline: torch.Tensor, recipe: Recipe) -> Batch:
    """Token rewards (score at the last token, KL per token when `kl_in_reward`), reward-to-go,
    minus the greedy baseline of the row's prompt. `baseline`: (prompts,), one per prompt."""
    mask = batch[col.RESPONSE_MASK]
    kl = kl_in_reward(batch, recipe.kl)
    rewards = advantages.token_rewards(batch[col.SCORES], mask, kl, recipe.kl.coef)
    per_row = baseline.float().repeat_interleave(len(batch) // len(baseline))  # rows are grouped by prompt
    adv, returns = advantages.remax(rewards, per_row, mask)
    return Batch({col.TOKEN_REWARDS: rewards, col.ADVANTAGES: adv, col.RETURNS: returns})
