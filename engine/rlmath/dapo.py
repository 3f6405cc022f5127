"""DAPO's reward shaping and group filter (Yu et al. 2025, arXiv 2503.14476): pure functions.

The program that uses them is `trainer/algorithms/dapo.py`. Shapes: B = sequences.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13), added to each response's reward.

    lengths: (B,) response tokens. With L = max_length and C = buffer (0 < C < L):
        0                          if |y| <= L - C
        penalty * (L - C - |y|) / C if L - C < |y| <= L    (linearly down to -penalty at L)
        -penalty                   if |y| > L
    Returns (B,) float32. `buffer=0` turns the shaping off (all zeros).
    """
    lengths = lengths.float()
    if buffer <= 0:
        return torch.zeros_like(lengths)
    if buffer >= max_length:
        raise ValueError(f"the overlong buffer ({buffer}) must be shorter than the maximum length ({max_length})")
    over = (lengths - (max_length - buffer)).clamp(min=0) / buffer
    return -penalty * over.clamp(max=1.0)


def varied_groups(scores: torch.Tensor, group_ids: Sequence[Hashable]) -> tuple[list[list[int]], list[list[int]]]:
    """DAPO's dynamic sampling filter (Sec. 3.2, eq. 11: 0 < |{correct}| < G).

    scores: (B,); group_ids: B ids. Returns (kept, dropped): the rows of each group, in the
    order groups first appear, split by whether the group's scores differ at all. A group
    whose scores are all equal (every sample right, or every one wrong) has zero
    group-normalised advantage, so it adds no gradient and only dilutes the batch.
    """
    index: dict[Hashable, list[int]] = {}
    for row, gid in enumerate(group_ids):
        index.setdefault(gid, []).append(row)
    kept, dropped = [], []
    for rows in index.values():
        group = scores[rows]
        (kept if bool((group != group[0]).any()) else dropped).append(rows)
    return kept, dropped
