"""GRPO as a single-controller program (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300).

Each step samples n responses per prompt, scores them, normalises the scores within
each prompt's group, and takes PPO-clip steps on the policy, with a KL term to the
frozen reference. There is no critic.
"""

from __future__ import annotations

from hflow.engine.groups.batch import Batch
from hflow.trainer import advantages
from hflow.trainer.losses import kl_estimate
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.writer import RunDir
from hflow.trainer.control.session import Session


def train(recipe: Recipe, run: RunDir) -> None:
    roles = recipe.algorithm_spec.roles_for(recipe.uses_reference)
    with Session(recipe, run, roles) as session:
        session.init_workers()
        actor, reward = session.groups["actor"], session.groups["reward"]

        for step in session.steps():
            with session.stage("generate"):
                batch = actor.generate_sequences(session.prompts(step))
            batch = session.score_with_policies(batch)
            with session.stage("reward"):
                batch |= reward.compute_reward(batch)
            with session.stage("advantage"):
                batch |= compute_advantages(batch, recipe)
            with session.stage("update_actor"):
                metrics = actor.update_actor(batch)
            session.end_step(step, batch, metrics)
        session.finish()


def compute_advantages(batch: Batch, recipe: Recipe) -> Batch:
    """Group-normalised sequence scores; with `kl_in_reward`, the summed KL is charged first."""
    g = recipe.grpo
    scores = batch["scores"].float()
    if g.kl_in_reward and "ref_log_probs" in batch:
        kl = kl_estimate(batch["old_log_probs"], batch["ref_log_probs"], g.kl_estimator)
        scores = scores - g.kl_coef * (kl * batch["response_mask"]).sum(-1)
    adv = advantages.grpo(scores, batch["uid"], eps=g.eps, scale_by_std=g.scale_by_std)
    return Batch({"advantages": adv})
