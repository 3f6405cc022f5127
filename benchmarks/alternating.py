"""Two or more ways of doing the same work timed side by side in one process: each way once first
(its kernels built, its memory touched), then `rounds` rounds, the ways' order reversed every other
round so that neither always runs after the other; the best and median milliseconds of each and
the ratio of the first median to the second (the benchmarks' `*_ab.py`)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def times(ways: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """{way: its milliseconds per round}."""
    for run in ways.values():
        run()
    found = {name: [] for name in ways}
    for r in range(rounds):
        for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            start = time.perf_counter()
            ways[name]()
            found[name].append((time.perf_counter() - start) * 1e3)
    return found


def report(title: str, ways: dict[str, Callable[[], object]], rounds: int, flops: float | None = None) -> None:
    """Prints each way's best and median (and GFLOP/s of `flops` per call) and the medians' ratio."""
    found = times(ways, rounds)
    medians = [statistics.median(t) for t in found.values()]
    print(title)
    for (name, t), median in zip(found.items(), medians):
        rate = f"  {flops / median / 1e6:6.0f} GFLOP/s" if flops else ""
        print(f"  {name:28s} best {min(t):9.2f} ms  median {median:9.2f} ms{rate}")
    print(f"  {'ratio of the medians':28s} {medians[0] / medians[1]:.2f}x")
