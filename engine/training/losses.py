"""Policy losses and KL estimators: pure functions on (B, T) token tensors.

`mask` is 1 on response tokens and 0 on padding. Losses are token-means over the
mask unless `normalizer` is given: then the masked sum is divided by it, which is how
the update makes the mean span a whole mini-batch split into micro-batches and ranks.
"""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def _reduce(values: torch.Tensor, mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
    if normalizer is None:
        return masked_mean(values, mask)
    return (values * mask).sum() / normalizer


def ppo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                    normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv 1707.06347, eq. 7), negated.

    All inputs (B, T); `advantages` may also be (B,) and is then broadcast over tokens.
    Per token: max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)), r = exp(logp - old).
    Returns the loss and metrics: clipfrac (share of tokens where clipping is active)
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
    loss = _reduce(per_token, mask, normalizer)
    with torch.no_grad():
        metrics = {
            "clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
            "approx_kl": float(masked_mean(-log_ratio, mask)),
        }
    return loss, metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.2, normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss (Schulman et al. 2017's baselines `ppo2`; Andrychowicz et al.
    2021, arXiv 2006.05990, Sec. 3.1), as in verl, OpenRLHF and safe-rlhf.

    All inputs (B, T). Per token, with v' = old + clamp(v - old, -clip, clip):
        0.5 * max((v - R)^2, (v' - R)^2)
    `clip=None` gives the plain 0.5 * (v - R)^2. Returns the loss and metrics: clipfrac
    (share of tokens where the clipped term is the larger) and vpred_mean.
    """
    mask = mask.to(values.dtype)
    unclipped = (values - returns).square()
    if clip is None:
        per_token, clipped = unclipped, unclipped
    else:
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (clipped_values - returns).square()
        per_token = torch.maximum(unclipped, clipped)
    loss = 0.5 * _reduce(per_token, mask, normalizer)
    with torch.no_grad():
        metrics = {
            "clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
            "vpred_mean": float(masked_mean(values.detach(), mask)),
        }
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over masked tokens: 1 is a perfect critic,
    0 no better than a constant, below 0 worse (the `explained_variance` of OpenAI baselines)."""
    mask = mask.to(torch.float32)
    var_returns = masked_mean((returns - masked_mean(returns, mask)).square(), mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)).square(), mask)
    if float(var_returns) == 0.0:
        return float("nan")
    return float(1.0 - var_residual / var_returns)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens (B, T).

    Schulman, "Approximating KL Divergence" (2020), with d = ref_logp - logp:
      k1 = -d                   unbiased, high variance, can be negative
      k2 = d^2 / 2              biased, low variance
      k3 = exp(d) - d - 1       unbiased, low variance, never negative
      abs = |d|
    """
    d = ref_logprobs - logprobs
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        # Clamp d before exp so that one runaway token cannot overflow the loss.
        d = d.clamp(-20.0, 20.0)
        return torch.exp(d) - d - 1.0
    if kind == "abs":
        return d.abs()
    raise ValueError(f"unknown KL estimator {kind!r}; accepted: k1, k2, k3, abs")
