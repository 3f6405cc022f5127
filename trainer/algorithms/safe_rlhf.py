"""Safe-RLHF as a single-controller program: PPO-Lagrangian with a reward and a cost
(Dai et al. 2023, "Safe RLHF", arXiv 2310.12773, Sec. 3.3; the PPOLagTrainer of
PKU-Alignment/safe-rlhf).

PPO (`ppo.py`) with a second score: a cost model (or function), scored like the reward,
with its own critic. The policy maximises reward subject to mean episode cost <= d
(`safe_rlhf.cost_limit`) through the Lagrangian min_theta max_{lambda >= 0}
-J_R(theta) + lambda * (J_C(theta) - d). Each step:
  - lambda takes one SGD step on log(lambda) (`engine/rlmath/safe_rlhf.py`), from the recent episodes' mean cost;
  - the KL penalty -beta * KL is split as in safe-rlhf: half added to the reward's token
    rewards, half subtracted from the cost's (so each side carries its share of it);
  - reward and cost each get GAE advantages from their critic, combined for the actor as
    (A_r - lambda * A_c) / (1 + lambda).
"""

from __future__ import annotations

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.rlmath import advantages
from hflow.engine.rlmath.kl import kl_controller, kl_in_reward
from hflow.engine.rlmath.safe_rlhf import Lagrangian, combine_advantages
from hflow.trainer.algorithms import ppo
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.session import Session
from hflow.trainer.data.ptx import PtxData
from hflow.trainer.rundir.writer import RunDir


def train(recipe: Recipe, run: RunDir) -> None:
    roles = recipe.algorithm_spec.roles_for(recipe.uses_reference)
    with Session(recipe, run, roles) as session:
        session.init_workers()
        actor, critic, cost_critic, reward, cost = (session.groups[r] for r in roles[:5])
        p, s = recipe.ppo, recipe.safe_rlhf
        kl_ctl = session.track("kl_controller", kl_controller(p.kl_coef, p.kl_target, p.kl_horizon))
        lagrangian = session.track("lagrangian", Lagrangian(s.lambda_init, s.lambda_lr, s.lambda_max, s.cost_limit,
                                                            s.episode_cost_window, s.lambda_update_delay_steps))
        ptx = PtxData.from_recipe(recipe)

        for step in session.steps():
            with session.stage("generate"):
                batch = actor.generate_sequences(session.prompts(step))
            batch = session.old_log_probs(batch)
            batch = session.reference_log_probs(batch)
            with session.stage("values"):
                batch |= critic.compute_values(batch)
                batch |= cost_critic.compute_values(batch)
            with session.stage("reward"):
                batch |= reward.compute_reward(batch)
                batch |= cost.compute_cost(batch)
            if not session.finite_scores(batch, step):  # a NaN/inf score, trainer.on_nonfinite: skip_step
                session.end_step(step, batch)  # logged, with no update
                continue
            with session.stage("lagrange"):
                multiplier = lagrangian.step(batch[col.COSTS].tolist(), step)
            with session.stage("advantage"):
                batch |= compute_advantages(batch, recipe, kl_ctl.value, multiplier)
            with session.stage("update_critic"):
                critic_metrics = critic.update_critic(batch)
                cost_critic_metrics = cost_critic.update_critic(batch)
            with session.stage("update_actor"):
                actor_metrics = actor.update_actor(batch | ptx.batch(step, len(batch)))
            stats = {**ppo.step_stats(batch, recipe, kl_ctl.value),
                     **ppo.step_stats(batch, recipe, kl_ctl.value, col.COST_VALUES, col.COST_RETURNS, "cost_critic"),
                     "lagrange/lambda": multiplier, "lagrange/episode_cost": lagrangian.window_mean}
            kl_ctl.update(stats["kl/sequence"], n_steps=len(batch))
            session.end_step(step, batch, actor_metrics, critic_metrics, cost_critic_metrics, stats)
        session.finish()


def compute_advantages(batch: Batch, recipe: Recipe, kl_coef: float, multiplier: float) -> Batch:
    """GAE for the reward and for the cost, each with half the KL penalty, combined for the actor.

    Returns `advantages` (combined; whitened when `ppo.whiten_advantages`), `returns` and
    `cost_returns` (the critics' targets), `token_rewards` and `token_costs` (N, R).
    """
    p, mask = recipe.ppo, batch[col.RESPONSE_MASK]
    kl = kl_in_reward(batch, recipe.kl)
    # safe-rlhf's PPOLagTrainer: reward tokens get +0.5 * (-beta * KL), cost tokens -0.5 * (-beta * KL).
    rewards = advantages.token_rewards(batch[col.SCORES], mask, kl, 0.5 * kl_coef)
    costs = advantages.token_rewards(batch[col.COSTS], mask, kl, -0.5 * kl_coef)
    reward_adv, returns = advantages.gae(rewards, batch[col.VALUES], mask, p.gamma, p.lam)
    cost_adv, cost_returns = advantages.gae(costs, batch[col.COST_VALUES], mask, p.gamma, p.lam)
    adv = combine_advantages(reward_adv, cost_adv, multiplier)
    if p.whiten_advantages:
        adv = advantages.whiten(adv, mask)
    return Batch({col.ADVANTAGES: adv, col.RETURNS: returns, col.COST_RETURNS: cost_returns,
                  col.TOKEN_REWARDS: rewards, col.TOKEN_COSTS: costs})
