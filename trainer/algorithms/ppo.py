"""PPO as a single-controller program (Ouyang et al. 2022, InstructGPT, arXiv 2203.02155;
Ziegler et al. 2019, arXiv 1909.08593; Schulman et al. 2017, arXiv 1707.06347).

Each step samples responses, scores them with the reward model (or function), charges
the KL to the frozen reference per token in the reward, estimates advantages with GAE
from the critic's values, and takes clipped steps on the critic and the policy. The KL
coefficient is fixed or adapted towards `ppo.kl_target` (`engine/rlmath/kl.py`).
"""

from __future__ import annotations

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.rlmath import advantages
from hflow.engine.rlmath.aggregation import masked_mean
from hflow.engine.rlmath.kl import kl_controller, kl_in_reward
from hflow.engine.rlmath.value import explained_variance
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.session import Session
from hflow.trainer.data.ptx import PtxData
from hflow.trainer.rundir.writer import RunDir


def train(recipe: Recipe, run: RunDir) -> None:
    roles = recipe.algorithm_spec.roles_for(recipe.uses_reference)
    with Session(recipe, run, roles) as session:
        session.init_workers()
        actor, critic, reward = (session.groups[r] for r in ("actor", "critic", "reward"))
        p = recipe.ppo
        kl_ctl = session.track("kl_controller", kl_controller(p.kl_coef, p.kl_target, p.kl_horizon))
        ptx = PtxData.from_recipe(recipe)

        for step in session.steps():
            with session.stage("generate"):
                batch = actor.generate_sequences(session.prompts(step))
            batch = session.old_log_probs(batch)
            batch = session.reference_log_probs(batch)
            with session.stage("values"):
                batch |= critic.compute_values(batch)
            with session.stage("reward"):
                batch |= reward.compute_reward(batch)
            if not session.finite_scores(batch, step):  # a NaN/inf score, trainer.on_nonfinite: skip_step
                session.end_step(step, batch)  # logged, with no update
                continue
            with session.stage("advantage"):
                batch |= compute_advantages(batch, recipe, kl_ctl.value)
            with session.stage("update_critic"):
                critic_metrics = critic.update_critic(batch)
            with session.stage("update_actor"):
                actor_metrics = actor.update_actor(batch | ptx.batch(step, len(batch)))
            stats = step_stats(batch, recipe, kl_ctl.value)
            kl_ctl.update(stats["kl/sequence"], n_steps=len(batch))
            session.end_step(step, batch, actor_metrics, critic_metrics, stats)
        session.finish()


def compute_advantages(batch: Batch, recipe: Recipe, kl_coef: float) -> Batch:
    """Token rewards (score at the last token, -kl_coef * KL on every token), then GAE.

    Returns `token_rewards`, `advantages` (whitened when `ppo.whiten_advantages`) and
    `returns` (N, R), the critic's targets.
    """
    p = recipe.ppo
    mask = batch[col.RESPONSE_MASK]
    kl = kl_in_reward(batch, recipe.kl)
    rewards = advantages.token_rewards(batch[col.SCORES], mask, kl, kl_coef)
    adv, returns = advantages.gae(rewards, batch[col.VALUES], mask, p.gamma, p.lam)
    if p.whiten_advantages:
        adv = advantages.whiten(adv, mask)
    return Batch({col.TOKEN_REWARDS: rewards, col.ADVANTAGES: adv, col.RETURNS: returns})


def step_stats(batch: Batch, recipe: Recipe, kl_coef: float, values_key: str = col.VALUES,
               returns_key: str = col.RETURNS, prefix: str = "critic") -> dict[str, float]:
    """Controller-side statistics of a step: the KL coefficient, the mean over sequences of
    their summed KL (what the adaptive controller tracks), and how well the critic's values
    (before its update) explained the returns."""
    mask = batch[col.RESPONSE_MASK].float()
    kl = kl_in_reward(batch, recipe.kl)
    stats = {"kl/coef": kl_coef, "kl/sequence": float((kl * mask).sum(-1).mean()) if kl is not None else 0.0}
    stats[f"{prefix}/vf_explained_var"] = explained_variance(batch[values_key], batch[returns_key], mask)
    stats[f"{prefix}/values_mean"] = float(masked_mean(batch[values_key], mask))
    stats[f"{prefix}/returns_mean"] = float(masked_mean(batch[returns_key], mask))
    return stats
