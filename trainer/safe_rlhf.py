"""Safe-RLHF as a single-controller program: PPO-Lagrangian with a reward and a cost
(Dai et al. 2023, "Safe RLHF", arXiv 2310.12773, Sec. 3.3; the PPOLagTrainer of
PKU-Alignment/safe-rlhf).

PPO (`ppo.py`) with a second score: a cost model (or function), scored like the reward,
with its own critic. The policy maximises reward subject to mean episode cost <= d
(`safe_rlhf.cost_limit`) through the Lagrangian min_theta max_{lambda >= 0}
-J_R(theta) + lambda * (J_C(theta) - d). Each step:
  - lambda takes one SGD step on log(lambda) (below), from the recent episodes' mean cost;
  - the KL penalty -beta * KL is split as in safe-rlhf: half added to the reward's token
    rewards, half subtracted from the cost's (so each side carries its share of it);
  - reward and cost each get GAE advantages from their critic, combined for the actor as
    (A_r - lambda * A_c) / (1 + lambda).
"""

from __future__ import annotations

import math
from collections import deque

import torch

from hflow.engine.batch import Batch
from hflow.trainer import advantages, ppo
from hflow.trainer.kl_control import kl_controller
from hflow.trainer.ptx import PtxData
from hflow.trainer.recipe import Recipe
from hflow.trainer.run import RunDir
from hflow.trainer.session import Session


def train(recipe: Recipe, run: RunDir) -> None:
    roles = ["actor", "critic", "cost_critic", "reward", "cost"] + (["reference"] if recipe.uses_reference else [])
    with Session(recipe, run, roles) as session:
        session.init_workers(total_updates=recipe.trainer.total_steps * recipe.updates_per_step("actor"))
        actor, critic, cost_critic, reward, cost = (session.groups[r] for r in roles[:5])
        p, s = recipe.ppo, recipe.safe_rlhf
        kl_ctl = session.track("kl_controller", kl_controller(p.kl_coef, p.kl_target, p.kl_horizon))
        lagrangian = session.track("lagrangian", Lagrangian(s.lambda_init, s.lambda_lr, s.lambda_max, s.cost_limit,
                                                            s.episode_cost_window, s.lambda_update_delay_steps))
        ptx = PtxData.from_recipe(recipe)

        for step in session.steps():
            with session.stage("generate"):
                batch = actor.generate_sequences(session.prompts(step))
            batch = session.score_with_policies(batch)
            with session.stage("values"):
                batch |= critic.compute_values(batch)
                batch |= cost_critic.compute_values(batch)
            with session.stage("reward"):
                batch |= reward.compute_reward(batch)
                batch |= cost.compute_cost(batch)
            with session.stage("lagrange"):
                multiplier = lagrangian.step(batch["costs"].tolist(), step)
            with session.stage("advantage"):
                batch |= compute_advantages(batch, recipe, kl_ctl.value, multiplier)
            with session.stage("update_critic"):
                critic_metrics = critic.update_critic(batch)
                cost_critic_metrics = cost_critic.update_critic(batch)
            with session.stage("update_actor"):
                actor_metrics = actor.update_actor(batch | ptx.batch(step, len(batch)))
            stats = {**ppo.step_stats(batch, recipe, kl_ctl.value),
                     **ppo.step_stats(batch, recipe, kl_ctl.value, "cost_values", "cost_returns", "cost_critic"),
                     "lagrange/lambda": multiplier, "lagrange/episode_cost": lagrangian.window_mean}
            kl_ctl.update(stats["kl/sequence"], n_steps=len(batch))
            session.end_step(step, batch, actor_metrics, critic_metrics, cost_critic_metrics, stats)
        session.finish()


def compute_advantages(batch: Batch, recipe: Recipe, kl_coef: float, multiplier: float) -> Batch:
    """GAE for the reward and for the cost, each with half the KL penalty, combined for the actor.

    Returns `advantages` (combined; whitened when `ppo.whiten_advantages`), `returns` and
    `cost_returns` (the critics' targets), `token_rewards` and `token_costs` (N, R).
    """
    p, mask = recipe.ppo, batch["response_mask"]
    kl = ppo.token_kl(batch, recipe)
    # safe-rlhf's PPOLagTrainer: reward tokens get +0.5 * (-beta * KL), cost tokens -0.5 * (-beta * KL).
    rewards = advantages.token_rewards(batch["scores"], mask, kl, 0.5 * kl_coef)
    costs = advantages.token_rewards(batch["costs"], mask, kl, -0.5 * kl_coef)
    reward_adv, returns = advantages.gae(rewards, batch["values"], mask, p.gamma, p.lam)
    cost_adv, cost_returns = advantages.gae(costs, batch["cost_values"], mask, p.gamma, p.lam)
    adv = combine_advantages(reward_adv, cost_adv, multiplier)
    if p.whiten_advantages:
        adv = advantages.whiten(adv, mask)
    return Batch({"advantages": adv, "returns": returns, "cost_returns": cost_returns,
                  "token_rewards": rewards, "token_costs": costs})


def combine_advantages(reward_adv: torch.Tensor, cost_adv: torch.Tensor, lam: float) -> torch.Tensor:
    """The actor's advantage (A_r - lam * A_c) / (1 + lam), any matching shapes (safe-rlhf's
    PPOLagTrainer; dividing by 1 + lam keeps its scale, and so PPO's clip, independent of lam)."""
    return (reward_adv - lam * cost_adv) / (1.0 + lam)


class Lagrangian:
    """The Lagrange multiplier lambda > 0, kept as log(lambda) (Dai et al. 2023, eq. 12;
    Stooke et al. 2020, arXiv 2007.03964).

    `update(Jc)` takes one SGD step on the multiplier's loss -(Jc - d) * lambda with respect
    to log(lambda):
        log_lambda <- log_lambda + lambda_lr * (Jc - d) * lambda
    then caps lambda at `lambda_max`: lambda grows while the mean episode cost Jc is above
    the limit d and shrinks once it is below. `step(costs, step)` feeds a step's episode
    costs into a moving window of the last `window` episodes and, after
    `delay_steps` RL steps, updates with the window's mean. The state (log lambda and the
    window) goes into the run's checkpoint.
    """

    def __init__(self, lambda_init: float, lambda_lr: float, lambda_max: float | None = None,
                 cost_limit: float = 0.0, window: int = 128, delay_steps: int = 0):
        self.log_lambda = math.log(lambda_init)
        self.lambda_lr = lambda_lr
        self.log_lambda_max = math.log(lambda_max) if lambda_max else None
        self.cost_limit = cost_limit
        self.delay_steps = delay_steps
        self.costs: deque[float] = deque(maxlen=window)

    @property
    def value(self) -> float:
        return math.exp(self.log_lambda)

    @property
    def window_mean(self) -> float:
        return sum(self.costs) / len(self.costs) if self.costs else 0.0

    def update(self, mean_episode_cost: float) -> float:
        self.log_lambda += self.lambda_lr * (mean_episode_cost - self.cost_limit) * self.value
        if self.log_lambda_max is not None:
            self.log_lambda = min(self.log_lambda, self.log_lambda_max)
        return self.value

    def step(self, episode_costs: list[float], step: int) -> float:
        """Add a step's episode costs to the window; from step `delay_steps + 1` on, update."""
        self.costs.extend(float(c) for c in episode_costs)
        if step > self.delay_steps:
            self.update(self.window_mean)
        return self.value

    def state_dict(self) -> dict:
        return {"log_lambda": self.log_lambda, "costs": list(self.costs)}

    def load_state_dict(self, state: dict) -> None:
        self.log_lambda = float(state["log_lambda"])
        self.costs.clear()
        self.costs.extend(state["costs"])
