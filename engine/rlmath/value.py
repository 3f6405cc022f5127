"""The critic's loss and how well it explains the returns. Tensors (B, T); `mask` is 1 on
response tokens."""

from __future__ import annotations

import torch

from hflow.engine.rlmath.aggregation import aggregate, masked_mean


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
    loss = 0.5 * aggregate(per_token, mask, "token-mean", normalizer)
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
