"""GRPO as a single-controller program (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300).

Each step samples n responses per prompt, scores them, normalises the scores within
each prompt's group, and takes PPO-clip steps on the policy, with a KL term to the
frozen reference. There is no critic.
"""

from __future__ import annotations

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.trainer import advantages
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.session import Session
from hflow.trainer.losses import kl_estimate
from hflow.trainer.rundir.writer import RunDir


def train(recipe: Recipe, run: RunDir) -> None:
    roles = recipe.algorithm_spec.roles_for(recipe.uses_reference)
    with Session(recipe, run, roles) as session:
        session.init_workers()
        actor, reward = session.groups["actor"], session.groups["reward"]

        for step in session.steps():
            with session.stage("generate"):
                batch = actor.generate_sequences(session.prompts(step))
            batch = session.old_log_probs(batch)
            batch = session.reference_log_probs(batch)
            with session.stage("reward"):
                batch |= reward.compute_reward(batch)
            if not session.finite_scores(batch, step):  # a NaN/inf score, trainer.on_nonfinite: skip_step
                session.end_step(step, batch)  # logged, with no update
                continue
            with session.stage("advantage"):
                batch |= compute_advantages(batch, recipe)
            with session.stage("update_actor"):
                metrics = actor.update_actor(batch)
            session.end_step(step, batch, metrics)
        session.finish()


def compute_advantages(batch: Batch, recipe: Recipe) -> Batch:
    """Group-normalised sequence scores; with `kl_in_reward`, the summed KL is charged first."""
    g = recipe.grpo
    scores = batch[col.SCORES].float()
    if g.kl_in_reward and col.REF_LOG_PROBS in batch:
        kl = kl_estimate(batch[col.OLD_LOG_PROBS], batch[col.REF_LOG_PROBS], g.kl_estimator)
        scores = scores - g.kl_coef * (kl * batch[col.RESPONSE_MASK]).sum(-1)
    adv = advantages.grpo(scores, batch[col.UID], eps=g.eps, scale_by_std=g.scale_by_std)
    return Batch({col.ADVANTAGES: adv})
