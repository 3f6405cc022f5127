"""How sure an evaluation is: 95% intervals for a share measured on P prompts, and for the
difference between two models scored on the same prompts (`hflow eval --compare`).

- One model: the Wilson score interval of a share (Wilson 1927), which stays inside [0, 1] and
  keeps its coverage at small P and at shares near 0 or 1, where the normal approximation fails.
- Two models on the same prompts: a paired percentile bootstrap of the mean per-prompt difference
  (Efron & Tibshirani 1993): prompts are resampled with replacement, each keeping both models'
  values, so that what the two share (a hard prompt is hard for both) cancels. Seeded: the same
  inputs give the same interval.
"""

from __future__ import annotations

import math

import torch

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
BOOTSTRAP_ROUNDS = 2000


def wilson(share: float, count: int, z: float = Z95) -> tuple[float, float]:
    """The 95% Wilson interval of a share measured on `count` trials."""
    if count <= 0:
        return 0.0, 1.0
    denominator = 1 + z * z / count
    centre = (share + z * z / (2 * count)) / denominator
    half = z * math.sqrt(share * (1 - share) / count + z * z / (4 * count * count)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(a: torch.Tensor, b: torch.Tensor, rounds: int = BOOTSTRAP_ROUNDS,
                      seed: int = 0) -> tuple[float, float, float]:
    """(mean of a - b, 2.5th and 97.5th percentiles of its bootstrap distribution); a and b hold
    the two models' values for the same prompts, in the same order."""
    if a.shape != b.shape or a.dim() != 1 or not len(a):
        raise ValueError(f"paired values need one value per prompt on both sides, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    diff = a.double() - b.double()
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(diff), (rounds, len(diff)), generator=generator)
    means = diff[picks].mean(-1).sort().values
    return float(diff.mean()), float(means[int(0.025 * (rounds - 1))]), float(means[int(0.975 * (rounds - 1))])


def bootstrap_mean(values: torch.Tensor, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean of `values` (one per prompt)."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(values), (rounds, len(values)), generator=generator)
    means = values.double()[picks].mean(-1).sort().values
    return float(means[int(0.025 * (rounds - 1))]), float(means[int(0.975 * (rounds - 1))])


def interval(values: torch.Tensor) -> tuple[float, float]:
    """The 95% interval of the mean of per-prompt `values`: Wilson's when every value is 0 or 1 (a
    share of prompts), else the bootstrap's (a mean of k samples, a length)."""
    values = values.double()
    if bool(((values == 0) | (values == 1)).all()):
        return wilson(float(values.mean()), len(values))
    return bootstrap_mean(values)
