"""Importance weights for a rollout the trained policy did not sample, registered by name
(`actor.off_policy_correction`).

The behaviour policy sampled the rollout (its log-probs came with the generation, possibly some
policy versions ago: asynchronous rollout, or a generator whose numerics differ from the
trainer's); the proximal policy is the one the PPO ratio is clipped against (`old_log_probs`,
scored by the training engine before the update). The policy loss is then
w * max(-A * r, -A * clip(r)), r = pi_theta / pi_prox, with w the capped weight pi_prox / pi_behav:

    tis        min(w, cap)                 truncated importance sampling (Ionides 2008; for RL
               frameworks whose sampler is not the trained policy: Yao et al. 2025, "Your
               efficient RL framework secretly brings you off-policy RL training", verl's TIS)
    decoupled  w if w <= cap else 0        AReaL's decoupled PPO objective (Fu et al. 2025,
               arXiv 2505.24298, Sec. 4, eq. 5): a token whose weight passes the cap is left out
    none       1

No gradient flows through the weights (they are constants of the update).
"""

from __future__ import annotations

from typing import Callable

from hflow.engine.rlmath.lazy_torch import torch
from hflow.engine.rlmath.registry import Registry

Correction = Callable[["torch.Tensor", float], "torch.Tensor"]
OFF_POLICY_CORRECTIONS: Registry[Correction] = Registry("off-policy correction")


def _weights(log_weights: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_weights.clamp(max=20.0))  # exp(20) is far past any cap: no overflow


@OFF_POLICY_CORRECTIONS.register("none")
def no_correction(log_weights: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.ones_like(log_weights)


@OFF_POLICY_CORRECTIONS.register("tis")
def truncated(log_weights: torch.Tensor, cap: float) -> torch.Tensor:
    return _weights(log_weights).clamp(max=cap)


@OFF_POLICY_CORRECTIONS.register("decoupled")
def decoupled(log_weights: torch.Tensor, cap: float) -> torch.Tensor:
    weights = _weights(log_weights)
    return torch.where(weights <= cap, weights, torch.zeros_like(weights))


def capped_weights(log_weights: torch.Tensor, cap: float, mode: str = "tis") -> torch.Tensor:
    """Importance weights exp(log_weights), any shape, capped the way the correction `mode` says."""
    return OFF_POLICY_CORRECTIONS.get(mode)(log_weights.detach(), cap)


def behaviour_weights(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, cap: float,
                      mode: str = "tis") -> torch.Tensor:
    """(B, T) per-token weights pi_prox / pi_behav, capped (`capped_weights`)."""
    return capped_weights(proximal_log_probs - behaviour_log_probs, cap, mode)


def sequence_behaviour_weights(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor,
                               mask: torch.Tensor, cap: float, mode: str = "tis") -> torch.Tensor:
    """(B,) the sequence-level weight for GSPO's sequence ratio: the length-normalised (geometric
    mean) ratio exp(1/|y| sum_t (prox - behav)), as GSPO normalises its own ratio (Zheng et al.
    2025, arXiv 2507.18071, eq. 7), then capped (`capped_weights`)."""
    mask = mask.to(proximal_log_probs.dtype)
    mean_log = ((proximal_log_probs - behaviour_log_probs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return capped_weights(mean_log, cap, mode)
