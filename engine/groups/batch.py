"""Batch: the one container passed between the controller and the workers.

Named tensors that share their first (batch) dimension, non-tensor columns with one
entry per row (prompt text, answers, task names), and a `meta` dict for values that
belong to the whole batch (temperature, step). Shapes are documented where the
columns are made: `engine/workers/actor.py` for rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    columns: dict[str, list] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {k: t.shape[0] for k, t in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.columns.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the batch size: {sizes}")

    def __len__(self) -> int:
        for t in self.tensors.values():
            return t.shape[0]
        for v in self.columns.values():
            return len(v)
        return 0

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.columns

    def __getitem__(self, key: str):
        if key in self.tensors:
            return self.tensors[key]
        if key in self.columns:
            return self.columns[key]
        raise KeyError(f"Batch has no field {key!r}; it has {sorted(self.keys())}")

    def keys(self) -> list[str]:
        return [*self.tensors, *self.columns]

    def slice(self, start: int, stop: int) -> "Batch":
        return Batch(
            {k: t[start:stop] for k, t in self.tensors.items()},
            {k: v[start:stop] for k, v in self.columns.items()},
            dict(self.meta),
        )

    def index(self, rows: Sequence[int] | torch.Tensor) -> "Batch":
        """The rows at `rows`, in that order."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        listed = idx.tolist()
        return Batch(
            {k: t[idx] for k, t in self.tensors.items()},
            {k: [v[i] for i in listed] for k, v in self.columns.items()},
            dict(self.meta),
        )

    def chunk(self, chunks: int) -> list["Batch"]:
        """`chunks` consecutive pieces of equal size; the size must divide evenly."""
        n = len(self)
        if n % chunks:
            raise ValueError(f"cannot split a batch of {n} rows into {chunks} equal chunks")
        size = n // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, size: int) -> list["Batch"]:
        """Consecutive pieces of at most `size` rows."""
        return [self.slice(i, i + size) for i in range(0, len(self), size)]

    @staticmethod
    def concat(batches: Iterable["Batch"]) -> "Batch":
        batches = list(batches)
        if not batches:
            return Batch()
        first = batches[0]
        return Batch(
            {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors},
            {k: [x for b in batches for x in b.columns[k]] for k in first.columns},
            dict(first.meta),
        )

    def select(self, *keys: str) -> "Batch":
        return Batch(
            {k: self.tensors[k] for k in keys if k in self.tensors},
            {k: self.columns[k] for k in keys if k in self.columns},
            dict(self.meta),
        )

    def union(self, other: "Batch") -> "Batch":
        """Fields of both; `other` wins where both have a field."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        return Batch({**self.tensors, **other.tensors}, {**self.columns, **other.columns},
                     {**self.meta, **other.meta})

    __or__ = union

    def repeat(self, times: int) -> "Batch":
        """Each row `times` times in a row (row 0, row 0, ..., row 1, ...): one group per prompt."""
        rows = torch.arange(len(self)).repeat_interleave(times)
        return self.index(rows)

    def to(self, device: torch.device | str) -> "Batch":
        return Batch({k: t.to(device) for k, t in self.tensors.items()}, self.columns, self.meta)
