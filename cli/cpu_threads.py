"""How hflow's CPU threads wait: passively, so a busy machine slows a step in proportion.

torch's CPU kernels run on an OpenMP team (GNU libgomp in the PyPI wheels). Between parallel
regions libgomp's idle threads spin for about 300,000 iterations before they sleep. On a
machine where another process holds a core, a spinning thread burns the slice its team mate
needs, and every parallel region waits for the thread the scheduler parked: measured on the
2-core development machine, the quickstart's 0.21 s step took 0.5-1.3 s beside one busy
process and 7-21 s beside two. With passive waiting (threads sleep at once) the same step took
0.27 s and 0.20 s (docs/benchmarks.md). The setting is read once, when the OpenMP runtime
starts, so it must be in the environment before torch is imported; workers hflow starts (Ray
actors, `torch.distributed` ranks) inherit it. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT
wins. How many threads a local run uses, step by step, is `trainer/placement/cpu_share.py`'s
choice (sleeping threads cost a wake-up per parallel region, which is why a small model gets one).
"""

from __future__ import annotations

import os

_USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def wait_passively(environ: dict | None = None) -> None:
    """Set OMP_WAIT_POLICY=PASSIVE in `environ` (default: the process's) unless the user chose
    a policy. Once torch is loaded it only reaches the processes started afterwards."""
    env = os.environ if environ is None else environ
    if not any(key in env for key in _USER_KEYS):
        env["OMP_WAIT_POLICY"] = "PASSIVE"
