"""From per-token losses (B, T) to one scalar: the loss aggregations, registered by name.

`mask` is 1 on response tokens and 0 on padding. `normalizer` replaces the local count a mode
divides by, which is how the update makes the mean span a whole mini-batch split into
micro-batches and ranks. The names are verl's (`actor.loss_agg_mode`):

    token-mean               sum_{i,t} m*x / sum_{i,t} m        every token weighs the same (DAPO,
                             Yu et al. 2025, arXiv 2503.14476, eq. 12; hflow's default)
    seq-mean-token-mean      1/B' sum_i (sum_t m*x / sum_t m)   each sequence weighs the same
                             (the original GRPO, Shao et al. 2024, arXiv 2402.03300, eq. 3)
    seq-mean-token-sum       1/B' sum_i sum_t m*x
    seq-mean-token-sum-norm  1/B' sum_i sum_t m*x / horizon     a constant divisor, no length bias
                             (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783, Sec. 3.1)

B' counts the sequences with at least one response token; `normalizer` replaces the divisor:
the response tokens (token-mean) or the sequences (seq-mean-*) of the whole mini-batch, per
rank. `horizon` is the maximum response length (default T, the mask's width, which is only
constant when the batch is padded to it).
"""

from __future__ import annotations

from typing import Callable

from hflow.engine.rlmath.lazy_torch import torch
from hflow.engine.rlmath.registry import Registry

Aggregation = Callable[["torch.Tensor", "torch.Tensor", "float | None", "int | None"], "torch.Tensor"]
AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              normalizer: float | None = None, horizon: int | None = None) -> torch.Tensor:
    """One scalar loss from per-token losses (B, T) and the response mask (B, T), the way the
    registered aggregation `mode` says (this module's docstring)."""
    return AGGREGATIONS.get(mode)(per_token, mask, normalizer, horizon)


@AGGREGATIONS.register("token-mean")
def token_mean(per_token: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None,
               horizon: int | None = None) -> torch.Tensor:
    total = (per_token * mask).sum()
    return total / normalizer if normalizer is not None else total / mask.sum().clamp(min=1)


def _over_sequences(per_sequence: torch.Tensor, mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
    sequences = normalizer if normalizer is not None else (mask.sum(-1) > 0).sum().clamp(min=1)
    return per_sequence.sum() / sequences


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None,
                        horizon: int | None = None) -> torch.Tensor:
    return _over_sequences((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1), mask, normalizer)


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(per_token: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None,
                       horizon: int | None = None) -> torch.Tensor:
    return _over_sequences((per_token * mask).sum(-1), mask, normalizer)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(per_token: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None,
                            horizon: int | None = None) -> torch.Tensor:
    return _over_sequences((per_token * mask).sum(-1) / (horizon or mask.shape[-1]), mask, normalizer)
