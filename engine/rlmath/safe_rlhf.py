"""Safe-RLHF's math (Dai et al. 2023, "Safe RLHF", arXiv 2310.12773, Sec. 3.3): the Lagrange
multiplier and the combined advantage. The controller program that uses them is
`trainer/algorithms/safe_rlhf.py`.
"""

from __future__ import annotations

import math
from collections import deque

import torch


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
