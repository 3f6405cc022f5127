"""How hflow's CPU threads wait between parallel regions: a short spin, then sleep.

torch's CPU kernels (and MKL's products) run on an OpenMP team (GNU libgomp in the PyPI wheels).
Between parallel regions libgomp's idle threads spin for about 300,000 iterations before they
sleep. On a machine where another process holds a core, a spinning thread burns the slice its
team mate needs, and every parallel region waits for the thread the scheduler parked: measured
on the 2-core development machine, the quickstart's 0.21 s step took 0.5-1.3 s beside one busy
process and 7-21 s beside two. Threads that sleep at once (`OMP_WAIT_POLICY=PASSIVE`, hflow's
setting until 2026-11-27) cost a wake-up at every region instead: SmolLM2's decoding step runs
about 240 regions a token, and its generation took 5.41 s against 3.99 with the default spin.
A spin of `SPIN_COUNT` iterations (each a `pause`: 28 ns on a Zen 3 EPYC, so about 85 us, the gap
between two regions of one step) keeps the idle speed and bounds the cost beside a busy process. On
the AVX-512 development machine 1,000 iterations did (4.01 s idle against the default's 3.99; 8.77 s
beside a busy process against 7.07 passive and 13.96 with the default spin); on a 2-core AVX2 EPYC,
whose steps run slower and so leave longer gaps, 1,000 left the idle generation 1.4x slower than the
default spin (9.14 s against 6.42), 3,000 did not (6.62), and beside a busy process 3,000 took
11.8-12.4 s against 10.3-12.2 at 1,000, 23.2 with the default spin and 10.3 passive
(`benchmarks/wait_policy.py`, docs/benchmarks.md). The setting is read once, when the OpenMP runtime
starts, so it must be in the environment before torch is imported; workers hflow starts (Ray actors,
`torch.distributed` ranks) inherit it. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. How many
threads a local run uses, step by step, is `trainer/placement/cpu_share.py`'s choice (a small model
gets one). The command (`cli/__init__.py`) and the Python API (`trainer/api/__init__.py`) set it.
"""

from __future__ import annotations

import os

_USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN_COUNT = "3000"


def spin_briefly(environ: dict | None = None) -> None:
    """Set GOMP_SPINCOUNT=`SPIN_COUNT` in `environ` (default: the process's) unless the user chose
    a policy. Once torch is loaded it only reaches the processes started afterwards."""
    env = os.environ if environ is None else environ
    if not any(key in env for key in _USER_KEYS):
        env["GOMP_SPINCOUNT"] = SPIN_COUNT
