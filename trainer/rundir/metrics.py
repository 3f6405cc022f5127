"""A run's events as columns: `MetricTable` keeps one float column per metric key, aligned
by row (one row per step), so charts slice arrays instead of re-walking dicts."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from typing import Any, Iterator

import numpy as np

NAN = math.nan


def _nan_column(n: int) -> array:
    return array("d", [NAN]) * n


class MetricTable:
    """All events of a run as columns: ``steps``, ``times`` and one per key.

    Every column has one entry per row; a key missing from an event is NaN in
    that row. A step not greater than the last one means the run was resumed
    from an earlier checkpoint: rows from that step on are dropped, so the
    table shows the history the resumed run actually continues.
    Non-numeric values (strings, lists) go to ``text`` (latest value only).
    """

    def __init__(self) -> None:
        self.steps = array("q")
        self.times = array("d")
        self.columns: dict[str, array] = {}
        self.text: dict[str, Any] = {}
        self.skipped = 0
        self._stats: dict[str, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, event: dict) -> None:
        try:
            step = int(event["step"])
        except (KeyError, TypeError, ValueError):
            self.skipped += 1
            return
        self._stats.clear()
        if self.steps and step <= self.steps[-1]:
            self._truncate(bisect_left(self.steps, step))
        n = len(self.steps)
        self.steps.append(step)
        t = event.get("time")
        self.times.append(float(t) if isinstance(t, (int, float)) else NAN)
        for key, value in event.items():
            if key in ("step", "time"):
                continue
            if not isinstance(value, (int, float)) or value is None:
                self.text[key] = value
                continue
            col = self.columns.get(key)
            if col is None:
                col = self.columns[key] = _nan_column(n)
            col.append(float(value))
        for col in self.columns.values():
            if len(col) == n:
                col.append(NAN)

    def _truncate(self, i: int) -> None:
        del self.steps[i:]
        del self.times[i:]
        for col in self.columns.values():
            del col[i:]

    def column(self, key: str) -> array | None:
        return self.columns.get(key)

    def value(self, key: str, row: int) -> float:
        col = self.columns.get(key)
        if col is None or not 0 <= row < len(col):
            return NAN
        return col[row]

    def stats(self, key: str) -> tuple[float, float]:
        """(mean, max) of a column ignoring NaN; cached until the next ``add``,
        so scrubbing a 100,000-step run does not rescan columns per keypress."""
        if key not in self._stats:
            col = np.array(self.columns.get(key, ()), dtype=np.float64)
            col = col[np.isfinite(col)]
            self._stats[key] = (float(col.mean()), float(col.max())) if col.size else (NAN, NAN)
        return self._stats[key]

    def row(self, i: int) -> dict[str, float]:
        """The event at row ``i`` as a dict of the keys it had."""
        return {k: c[i] for k, c in self.columns.items() if not math.isnan(c[i])}

    def keys(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, in the order they first appeared."""
        return [k for k in self.columns if k.startswith(prefix)]

    def row_of_step(self, step: int) -> int:
        """Row holding ``step``, or the last row before it."""
        i = bisect_left(self.steps, step)
        if i < len(self.steps) and self.steps[i] == step:
            return i
        return max(i - 1, 0)


def iter_memory_keys(keys: list[str]) -> Iterator[tuple[str, int, str]]:
    """(role, rank, key) for every ``memory/<role>/rank<k>/peak_bytes`` key."""
    for key in keys:
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "memory" and parts[3] == "peak_bytes" and parts[2].startswith("rank"):
            try:
                yield parts[1], int(parts[2][4:]), key
            except ValueError:
                continue
