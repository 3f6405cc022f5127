"""The KL divergence to the reference policy: its per-token estimators (registered by name,
`<algorithm>.kl_estimator`), the KL charged in the reward, and the coefficient's controllers.

Estimators, from sampled tokens, with d = ref_logp - logp (Schulman, "Approximating KL
Divergence", 2020):
    k1 = -d                   unbiased, high variance, can be negative
    k2 = d^2 / 2              biased, low variance
    k3 = exp(d) - d - 1       unbiased, low variance, never negative
    abs = |d|

Controllers (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", arXiv
1909.08593, Sec. 2.2): the coefficient beta is either fixed or adapted so that the policy's KL
to the reference tracks a target,
    e_t     = clip(KL_t / KL_target - 1, -0.2, 0.2)
    beta   <- beta * (1 + K_beta * e_t)          K_beta = n_steps / horizon
where KL_t is the mean over the step's sequences of their summed per-token KL (nats per
sequence) and n_steps the number of sequences the step used. The state is one float, kept in
the run's checkpoint so that a resumed run continues with the same beta.
"""

from __future__ import annotations

from typing import Callable

from hflow.engine import columns as col
from hflow.engine.rlmath.lazy_torch import torch
from hflow.engine.rlmath.registry import Registry
from hflow.engine.specs import KLSettings

KL_ESTIMATORS: Registry[Callable[["torch.Tensor"], "torch.Tensor"]] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def k1(d: torch.Tensor) -> torch.Tensor:
    return -d


@KL_ESTIMATORS.register("k2")
def k2(d: torch.Tensor) -> torch.Tensor:
    return 0.5 * d.square()


@KL_ESTIMATORS.register("k3")
def k3(d: torch.Tensor) -> torch.Tensor:
    d = d.clamp(-20.0, 20.0)  # before exp, so that one runaway token cannot overflow the loss
    return torch.exp(d) - d - 1.0


@KL_ESTIMATORS.register("abs")
def absolute(d: torch.Tensor) -> torch.Tensor:
    return d.abs()


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) (B, T) by the registered estimator `kind`."""
    return KL_ESTIMATORS.get(kind)(ref_logprobs - logprobs)


def kl_in_reward(columns, kl: KLSettings) -> torch.Tensor | None:
    """The per-token KL (B, T) an algorithm charges in the reward, or None: when it adds the KL to
    the actor's loss instead (`kl.in_reward` false) or no reference ran. `columns`: the step's
    columns by name (`engine/columns.py`), of which it reads the rollout policy's
    `old_log_probs` and the reference's `ref_log_probs`."""
    if not kl.in_reward or col.REF_LOG_PROBS not in columns:
        return None
    return kl_estimate(columns[col.OLD_LOG_PROBS], columns[col.REF_LOG_PROBS], kl.estimator)


class FixedKLController:
    def __init__(self, coef: float):
        self.value = coef

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    def __init__(self, coef: float, target: float, horizon: int):
        super().__init__(coef)
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value


def kl_controller(coef: float, target: float | None, horizon: int) -> FixedKLController:
    """A fixed controller, or an adaptive one when a target KL is given."""
    if target is None:
        return FixedKLController(coef)
    return AdaptiveKLController(coef, target, horizon)
