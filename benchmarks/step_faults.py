"""Each step's page faults, kernel time and resident size in a training run: `hflow train` as users
run it, its process's `/proc/PID/stat` sampled every 0.1 s and matched to each step's phase timings
in `events.jsonl` (Linux only).

    python benchmarks/step_faults.py grpo/quickstart --set model.path=models/smollm2-135m-instruct \
        --set model.init=null --set trainer.total_steps=6 ...

Prints, per step and phase above 0.05 s: its seconds, the pages faulted in, the seconds in the
kernel, and the resident MiB before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def sample(pid: int) -> tuple[float, int, float, float] | None:
    """(time, minor faults, kernel seconds, resident MiB) of `pid`, None once it has exited."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return time.time(), int(fields[7]), int(fields[12]) / TICK, int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "hflow", "train", args.recipe, "--output-dir", out,
                   "--set", "trainer.save_every=0", *[x for s in args.set for x in ("--set", s)]]
        log = open(Path(out) / "train.err", "w+")  # a file, not a pipe: a full pipe would stall the run
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        samples = []
        while (s := sample(process.pid)) is not None and process.poll() is None:
            samples.append(s)
            time.sleep(0.1)
        if process.wait() != 0:
            log.seek(0)
            sys.exit(f"hflow train failed:\n{log.read()[-2000:]}")
        log.close()
        events = next(Path(out).glob("*/events.jsonl"))
        steps = [e for e in map(json.loads, events.read_text().splitlines()) if "timing/step" in e]

    def at(t: float):
        return min(samples, key=lambda s: abs(s[0] - t))

    for e in steps:
        t, line = e["time"] - e["timing/step"], f"step {e['step']}: {e['timing/step']:.2f} s"
        for key in (k for k in e if k.startswith("timing/") and k != "timing/step"):
            a, b = at(t), at(t + e[key])
            t += e[key]
            if e[key] > 0.05:
                line += (f" | {key[7:]} {e[key]:.2f} s, {b[1] - a[1]} faults, {b[2] - a[2]:.2f} s in the kernel,"
                         f" {a[3]:.0f} -> {b[3]:.0f} MiB")
        print(line)


if __name__ == "__main__":
    main()
