"""How many threads torch's CPU kernels use in a local run's process, chosen before each step
(and once before `hflow eval` generates: `trainer/control/evaluate.py`).

Idle OpenMP threads spin before they sleep (`engine/cpu_threads.py`: libgomp's own spin where these
rules run, a short one where OMP_NUM_THREADS fixes the team); the rules keep a busy machine from
making them spin on cores they do not get. Three measured rules (docs/benchmarks.md, "A busy
machine") choose how many threads there are:

- **A model under 1M parameters runs on one thread.** Its matrix products are too small to
  split, and each parallel region wakes a sleeping thread: on the 2-core development machine
  the tiny model's step (16 prompts x 4, 64 tokens) took 0.41 s on two threads, 0.17 s on one
  (threads that slept at once, 2026-11-24).
- **Otherwise the process takes the cores other processes left free** during the previous
  step (the machine's busy time on the process's CPUs, less the process's own), at least one
  thread and at most the count it started with. A parallel region waits for its slowest
  thread, and a thread sharing a core with another process's runs a scheduler slice late: a
  3.5M-parameter model's step beside one busy process took 3.2 s on two threads and 2.1 s on
  one in one measurement, 2.33 s and 2.23 s in another (the machine's noise is large).
- **Two compute threads share the cores**: in async mode on the local backend the generator
  thread samples while the controller's thread trains; each takes its half of the free cores
  (the generator calls `apply()` as each step's rollout starts), instead of two teams of
  sleeping threads each waking on all of them.

Off when the user chose a count (OMP_NUM_THREADS: theirs wins), when torch starts with one
thread, and where /proc/stat cannot be read. The count is each thread's own (OpenMP's), so a
thread sets it for itself; a thread started later (a streamed step's producer) starts with the
count its starter set last.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import torch

from hflow.errors import UserError
from hflow.mapper.models import resolve_model
from hflow.trainer.config.recipe import Recipe

SMALL_MODEL_PARAMS = 1_000_000


class CpuShare:
    """`before_step()` sets torch's thread count for the coming step and returns the step's
    `cpu/*` metrics; `restore()` puts back the count the process started with."""

    def __init__(self, params: int | None, on: bool = True, compute_threads: int = 1, environ: dict | None = None,
                 stat_path: str = "/proc/stat", own_cpu_s: Callable[[], float] | None = None,
                 wall_s: Callable[[], float] = time.monotonic):
        env = os.environ if environ is None else environ
        self.base = torch.get_num_threads()
        self.small = params is not None and params < SMALL_MODEL_PARAMS
        self.compute_threads = compute_threads
        self._stat = Path(stat_path)
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._own = own_cpu_s or _own_cpu_seconds
        self._wall = wall_s
        self.enabled = on and "OMP_NUM_THREADS" not in env and self.base > 1
        self._last = self._sample() if self.enabled else None
        if self._last is None:
            self.enabled = False
        self.threads = self._share(self.base)  # until the first step's look: all cores free

    def before_step(self) -> dict[str, float]:
        """Choose and set the coming step's thread count; {} when the rules are off."""
        if not self.enabled:
            return {}
        now = self._sample()
        if now is None:
            return {}
        others = _others_cores(self._last, now)
        self._last = now
        self.threads = self._share(int(len(self._cpus) - others + 0.5))
        self.apply()
        return {"cpu/threads": float(self.threads), "cpu/others_cores": round(others, 2)}

    def apply(self) -> None:
        """Give the calling thread the chosen count (a no-op when the rules are off)."""
        if self.enabled and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def _share(self, free_cores: int) -> int:
        """Each compute thread's count: its part of `free_cores`, at least 1 and at most `base`."""
        return 1 if self.small else max(1, min(self.base, free_cores // self.compute_threads))

    def restore(self) -> None:
        if self.enabled and torch.get_num_threads() != self.base:
            torch.set_num_threads(self.base)

    def _sample(self) -> tuple[float, float, float] | None:
        """(seconds the process's CPUs were busy, the process's own CPU seconds, wall seconds)."""
        try:
            lines = self._stat.read_text().splitlines()
        except OSError:
            return None
        wanted = {f"cpu{i}" for i in self._cpus}
        busy = 0
        seen = 0
        for line in lines:
            fields = line.split()
            if fields and fields[0] in wanted and len(fields) >= 9:
                # user nice system idle iowait irq softirq steal: all but idle and iowait is busy
                # (steal: the hypervisor gave the core to someone else).
                ticks = [int(x) for x in fields[1:9]]
                busy += sum(ticks) - ticks[3] - ticks[4]
                seen += 1
        if seen != len(wanted) or not seen:
            return None
        return busy / os.sysconf("SC_CLK_TCK"), self._own(), self._wall()


def share_for(recipe: Recipe, backend: str, device: torch.device, compute_threads: int = 1) -> CpuShare:
    """A `CpuShare` for a recipe's actor (its parameter count read from its config; None where the
    shape is not known), on only where the workers compute in this process: the local `backend`
    on a CPU `device`."""
    try:
        params = resolve_model(recipe.model.path, init=recipe.model.init).params()
    except UserError:
        params = None
    return CpuShare(params, on=backend == "local" and device.type == "cpu", compute_threads=compute_threads)


def _others_cores(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Cores' worth of CPU time other processes used between two samples."""
    wall = after[2] - before[2]
    if wall <= 0:
        return 0.0
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / wall)


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system
