"""What huge pages for torch's CPU buffers cost the first time a process touches its memory
(`THP_MEM_ALLOC_ENABLE`, left off by `engine/host_memory.py`), with the `hflow` command's heap
settings in both.

    python benchmarks/first_touch.py --rounds 3 [--gib 1] [--buffer-mib 8]

Each round starts a fresh process without huge pages, then one with them: it writes --gib GiB in
buffers of --buffer-mib MiB (a first pass's activations) and prints the time, its seconds in the
kernel, its page faults and how much of the process the kernel gave huge pages.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from hflow.engine.host_memory import HOST_MEMORY_KEYS

TOUCH = """
import json, resource, sys, time
import torch
count, numel = int(sys.argv[1]), int(sys.argv[2])
before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
buffers = [torch.empty(numel).fill_(1.0) for _ in range(count)]
elapsed, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
huge = 0
try:
    with open("/proc/self/smaps_rollup") as f:
        huge = next((int(line.split()[1]) for line in f if line.startswith("AnonHugePages")), 0)
except OSError:
    pass
print(json.dumps({"s": elapsed, "kernel_s": after.ru_stime - before.ru_stime,
                  "faults": after.ru_minflt - before.ru_minflt, "huge_kib": huge}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--buffer-mib", type=int, default=8)
    args = parser.parse_args()
    numel = args.buffer_mib * (1 << 20) // 4
    count = max(1, int(args.gib * 1024 / args.buffer_mib))
    base = {**os.environ, **{key: str(value) for key, value in HOST_MEMORY_KEYS.items()}}
    for _ in range(args.rounds):
        for thp in ("0", "1"):
            done = subprocess.run([sys.executable, "-c", TOUCH, str(count), str(numel)], check=True,
                                  capture_output=True, text=True, env={**base, "THP_MEM_ALLOC_ENABLE": thp})
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"huge pages {'on ' if thp == '1' else 'off'}: {r['s'] * 1e3:6.0f} ms, {r['kernel_s']:.2f} s in the "
                  f"kernel, {r['faults']} page faults, {r['huge_kib'] // 1024} MiB in huge pages")


if __name__ == "__main__":
    main()
