"""How hflow's CPU threads wait between parallel regions: how long they spin before they sleep.

torch's CPU kernels (and MKL's products) run on an OpenMP team (GNU libgomp in the PyPI wheels).
Between parallel regions libgomp's idle threads spin for about 300,000 iterations before they
sleep. On a machine where another process holds a core, a spinning thread burns the slice its team
mate needs, and every parallel region waits for the thread the scheduler parked: measured on the
2-core development machine, the quickstart's 0.21 s step took 0.5-1.3 s beside one busy process
and 7-21 s beside two. Threads that sleep at once (`OMP_WAIT_POLICY=PASSIVE`, hflow's setting until
2026-11-27) cost a wake-up at every region instead: SmolLM2's decoding step runs about 240 regions
a token, and its generation took 5.41 s against 3.99 with the default spin.

Which spin depends on whether the team can shrink:

- **`OMP_NUM_THREADS` set** (by the user; Ray sets it to 1 in its one-CPU workers): the team is
  fixed, so a busy machine cannot take a thread out of it. A spin of `FIXED_TEAM_SPIN` iterations
  (each a `pause`: 28 ns on a Zen 3 EPYC, so about 85 us) bounds the cost beside a busy process and
  keeps most of the idle speed: on a 2-core AVX2 EPYC the recipe's generation took 6.62 s idle
  against the default spin's 6.42 and 11.8-12.4 s beside a busy process against 23.2 (1,000
  iterations: 9.14 idle; `benchmarks/wait_policy.py`, docs/benchmarks.md).
- **Not set**: a local CPU run chooses its thread count before every step from the cores other
  processes left free (`trainer/placement/cpu_share.py`), so beside a busy process its team is one
  thread and nothing spins on a core it does not get. There the threads keep libgomp's own spin
  (`SHRINKING_TEAM_SPIN`): the gaps between a small model's regions are longer than 85 us, and each
  wake-up is a sleeping core's. The 27.5M model's GRPO step (16 prompts x 4, 64 tokens, 2 cores)
  took 9.39 s against 10.21 at 3,000 idle (a first comparison: 10.2 against 12.2), and 15.6 against
  16.1 beside a busy process, one thread either way (`benchmarks/wait_policy.py --whole-run`,
  docs/benchmarks.md).

The setting is read once, when the OpenMP runtime starts, so it must be in the environment before
torch is imported; processes hflow starts inherit it. A user's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT wins. The command (`cli/__init__.py`) and the Python API (`trainer/api/__init__.py`)
set it; the test suite sets the fixed team's (`tests/conftest.py`: two workers share the cores).
"""

from __future__ import annotations

import os

_USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
FIXED_TEAM_SPIN = "3000"
SHRINKING_TEAM_SPIN = "300000"  # libgomp's own default, written out so that a run's environment says it


def choose_spin(environ: dict | None = None, fixed_team: bool | None = None) -> None:
    """Set GOMP_SPINCOUNT in `environ` (default: the process's) unless the user chose a policy:
    `FIXED_TEAM_SPIN` where the team is fixed (`fixed_team`; by default, where OMP_NUM_THREADS is
    set), `SHRINKING_TEAM_SPIN` otherwise. Once torch is loaded it only reaches the processes
    started afterwards."""
    env = os.environ if environ is None else environ
    fixed = "OMP_NUM_THREADS" in env if fixed_team is None else fixed_team
    if not any(key in env for key in _USER_KEYS):
        env["GOMP_SPINCOUNT"] = FIXED_TEAM_SPIN if fixed else SHRINKING_TEAM_SPIN
