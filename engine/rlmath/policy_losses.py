"""Policy losses, the actor's objective, registered by name (`<algorithm>.policy_loss` in a recipe).

The actor asks for one (`policy_loss(name)`) and calls it with the same arguments whichever it
is. A new loss is one function decorated with `register_policy_loss` here and its name in the
recipe's `PolicyLossName` (a test holds the two equal). All tensors are (B, T) unless said;
`mask` is 1 on response tokens and 0 on padding; every per-token loss is reduced by
`aggregation.aggregate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hflow.engine.rlmath.lazy_torch import torch
from hflow.engine.rlmath.aggregation import aggregate, masked_mean
from hflow.engine.rlmath.registry import Registry


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss. `fn(log_probs, old_log_probs, advantages, mask, clip_low, clip_high,
    normalizer=, mode=, horizon=, weights=) -> (loss, metrics)`, all tensors (B, T) but `weights`
    and a per-sequence `advantages` (B,). `per_sequence`: one importance ratio per sequence
    (GSPO), so the loss is a mean over sequences and an off-policy correction weighs whole
    sequences; otherwise per token."""

    name: str
    fn: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    per_sequence: bool = False


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str, per_sequence: bool = False) -> Callable:
    """Decorator: make `fn` the policy loss `name` (see `PolicyLoss`)."""
    def add(fn: Callable) -> Callable:
        POLICY_LOSSES.add(name, PolicyLoss(name, fn, per_sequence))
        return fn
    return add


def policy_loss(name: str) -> PolicyLoss:
    """The registered policy loss `name`."""
    return POLICY_LOSSES.get(name)


@register_policy_loss("ppo")
def ppo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                    normalizer: float | None = None, mode: str = "token-mean",
                    horizon: int | None = None,
                    weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv 1707.06347, eq. 7), negated.

    All inputs (B, T); `advantages` may also be (B,) and is then broadcast over tokens.
    Per token: max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)), r = exp(logp - old),
    times `weights` (B, T) when given (an off-policy correction: `behaviour_weights`),
    reduced by `aggregate(per_token, mask, mode, normalizer, horizon)`. Returns the loss and metrics: clipfrac (share of tokens where clipping is active)
    and approx_kl (token-mean of old - new log-prob).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    mask = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(per_token, mask, mode, normalizer, horizon)
    with torch.no_grad():
        metrics = {
            "clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
            "approx_kl": float(masked_mean(-log_ratio, mask)),
        }
    return loss, metrics


@register_policy_loss("gspo", per_sequence=True)
def gspo_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, clip_low: float = 3e-4, clip_high: float = 4e-4,
                     normalizer: float | None = None, mode: str = "seq-mean-token-mean",
                     horizon: int | None = None,
                     weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's clipped sequence-level surrogate (Zheng et al. 2025, arXiv 2507.18071, eqs. 5-7), negated.

    log_probs, old_log_probs, mask: (B, T); advantages: (B,), one per sequence (a (B, T)
    tensor is read at each row's first response token). Per sequence i, with |y_i| its
    response tokens:
        s_i    = exp(1/|y_i| sum_t (log_probs - old_log_probs))     the length-normalised ratio
        loss_i = max(-A_i * s_i, -A_i * clip(s_i, 1 - clip_low, 1 + clip_high))
    and the loss is the mean of loss_i over the sequences with at least one token
    (`normalizer` replaces their count, as `aggregate`'s seq-mean modes). The clip range
    is on a per-token-averaged log-ratio, so it is small (the paper: 3e-4 and 4e-4).
    `weights` (B,), when given, multiply loss_i (`sequence_behaviour_weights`). `mode` must be
    seq-mean-token-mean, the only aggregation of one term per sequence (`horizon` is unused).
    Returns the loss and metrics: clipfrac (share of sequences clipped), approx_kl.
    """
    if mode != "seq-mean-token-mean":
        raise ValueError(f"GSPO's loss is one term per sequence: loss aggregation {mode!r} is not defined for it")
    mask = mask.to(log_probs.dtype)
    if advantages.dim() == 2:
        first = (mask * torch.arange(mask.shape[1], 0, -1, device=mask.device)).argmax(-1)
        advantages = advantages.gather(1, first[:, None]).squeeze(1)
    log_ratio = log_probs - old_log_probs
    lengths = mask.sum(-1)
    seq_ratio = torch.exp((log_ratio * mask).sum(-1) / lengths.clamp(min=1))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1.0 - clip_low, 1.0 + clip_high)
    has_tokens = (lengths > 0).to(log_probs.dtype)
    per_sequence = torch.maximum(unclipped, clipped) * has_tokens
    if weights is not None:
        per_sequence = per_sequence * weights
    count = normalizer if normalizer is not None else has_tokens.sum().clamp(min=1)
    loss = per_sequence.sum() / count
    with torch.no_grad():
        metrics = {
            "clipfrac": float(masked_mean((clipped > unclipped).float(), has_tokens)),
            "approx_kl": float(masked_mean(-log_ratio, mask)),
        }
    return loss, metrics


@register_policy_loss("cispo")
def cispo_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor, clip_low: float = 1.0, clip_high: float = 0.28,
                      normalizer: float | None = None, mode: str = "token-mean", horizon: int | None = None,
                      weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO's objective (MiniMax-M1, MiniMax 2025, arXiv 2506.13585, eqs. 4-5), negated: every
    token's log-likelihood weighed by its advantage and by its importance ratio, clipped and held
    constant.

    All inputs (B, T); `advantages` may be (B,). Per token, r = exp(log_probs - old_log_probs):
        -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * log_probs
    times `weights` when given, reduced by `aggregate` (the paper: token-mean). PPO's clip drops
    the gradient of a token whose ratio left the range; here every token keeps a gradient,
    A * clip(r) * grad log p, only its weight is capped. The paper sets no lower bound (a large
    clip_low: 1.0 puts it at 0) and tunes clip_high. Metrics: clipfrac (share of tokens whose
    weight was clipped), approx_kl.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(log_probs)
    mask = mask.to(log_probs.dtype)
    log_ratio = (log_probs - old_log_probs).detach()
    ratio = torch.exp(log_ratio.clamp(max=20.0))  # exp(20) is far past any clip: no overflow
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = -clipped * advantages * log_probs
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(per_token, mask, mode, normalizer, horizon)
    with torch.no_grad():
        metrics = {"clipfrac": float(masked_mean((clipped != ratio).float(), mask)),
                   "approx_kl": float(masked_mean(-log_ratio, mask))}
    return loss, metrics
