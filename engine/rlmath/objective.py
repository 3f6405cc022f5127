"""The actor's objective, a sum of named parts: the policy loss the recipe names, each token (or
sequence) weighted by the off-policy correction when the sampler was not the policy scored before
the update, plus the KL to the reference when the algorithm adds it to the loss rather than the
reward. A pure function of a micro-batch's tensors: the actor worker calls it, and a test can.
(PPO-ptx's language-modelling term needs the model, so the actor adds it.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from hflow.engine.rlmath.aggregation import aggregate, masked_mean
from hflow.engine.rlmath.kl import kl_estimate
from hflow.engine.rlmath.off_policy import behaviour_weights, sequence_behaviour_weights
from hflow.engine.rlmath.policy_losses import PolicyLoss, policy_loss


@dataclass(frozen=True)
class ActorObjective:
    """policy_loss, loss_agg_mode, off_policy_correction, kl_estimator: registered names;
    clip: the ratio clip (low, high); horizon: the longest response (the seq-mean-token-sum-norm
    divisor); kl_coef: the KL term's weight in the loss (0 when the KL is charged in the reward)."""

    policy_loss: str
    clip: tuple[float, float]
    loss_agg_mode: str
    horizon: int
    off_policy_correction: str = "none"
    off_policy_cap: float = 2.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"

    @cached_property
    def loss(self) -> PolicyLoss:
        """The registered policy loss `policy_loss` names, looked up once."""
        return policy_loss(self.policy_loss)

    @property
    def per_token(self) -> bool:
        """Whether the loss is a mean over response tokens (else over sequences): what a
        mini-batch's loss is divided by."""
        return self.loss_agg_mode == "token-mean" and not self.loss.per_sequence

    def __call__(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, normalizer: float, behaviour_log_probs: torch.Tensor | None = None,
                 ref_log_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch and its parts' metrics. All (B, T) but a per-sequence
        `advantages` (B,); `normalizer` is the mini-batch's token (or sequence) count on this rank;
        `behaviour_log_probs` are the sampler's (read when a correction is on), `ref_log_probs` the
        reference's (read when kl_coef > 0)."""
        weights, weight_stats = self.off_policy_weights(old_log_probs, behaviour_log_probs, mask)
        pg_loss, pg_stats = self.loss.fn(
            log_probs, old_log_probs, advantages, mask, *self.clip, normalizer=normalizer,
            mode=self.loss_agg_mode, horizon=self.horizon, weights=weights)
        loss = pg_loss
        stats = {"pg_loss": float(pg_loss.detach()), **pg_stats, **weight_stats}
        if self.kl_coef > 0 and ref_log_probs is not None:
            token_kl = kl_estimate(log_probs, ref_log_probs, self.kl_estimator)
            kl_loss = aggregate(token_kl, mask, self.loss_agg_mode, normalizer, self.horizon)
            loss = loss + self.kl_coef * kl_loss
            stats["kl_loss"] = float(masked_mean(token_kl.detach(), mask))
        return loss, stats

    def off_policy_weights(self, old_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor | None,
                           mask: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The correction's weights pi_old / pi_behaviour (per token; per sequence for a
        per-sequence loss), or None without one; with their mean as `off_policy_weight`."""
        if self.off_policy_correction == "none":
            return None, {}
        mode, cap = self.off_policy_correction, self.off_policy_cap
        if self.loss.per_sequence:
            weights = sequence_behaviour_weights(old_log_probs, behaviour_log_probs, mask, cap, mode)
            return weights, {"off_policy_weight": float(weights.mean())}
        weights = behaviour_weights(old_log_probs, behaviour_log_probs, cap, mode)
        return weights, {"off_policy_weight": float(masked_mean(weights, mask))}
