"""Resident memory per stage of a `hflow train` run, in this process: before, the peak during, after.

    python benchmarks/stage_memory.py train RECIPE [--set KEY=VALUE ...]   # any `hflow` arguments

The run goes as `hflow train` runs it, on the local backend (the workers in this process); each
controller stage (`Session.stage`: generate, reward, update_actor, checkpoint, ...) prints one line
on stderr: the process's resident memory (RSS) before it, the highest seen while it ran (sampled
every 10 ms), and after it. Between the update's stages and the next step's the figure is what the
run holds for its whole length (weights, optimizer state); the update's peak adds its transients.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time


def resident_mib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def main(argv: list[str]) -> None:
    highest = {"mib": 0}

    def sample() -> None:
        while True:
            highest["mib"] = max(highest["mib"], resident_mib())
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    from hflow.trainer.control import session

    stage = session.Session.stage

    @contextlib.contextmanager
    def measured(self, name: str):
        before = highest["mib"] = resident_mib()
        with stage(self, name):
            yield
        print(f"stage {name:<16} before {before:>6} MiB   peak {highest['mib']:>6} MiB   after {resident_mib():>6} MiB",
              file=sys.stderr, flush=True)

    session.Session.stage = measured
    from hflow.cli.app import main as hflow

    sys.argv = ["hflow", *argv]
    hflow()


if __name__ == "__main__":
    main(sys.argv[1:])
