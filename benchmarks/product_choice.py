"""How steady the measurement that picks oneDNN or the BLAS for each kind of a run's CPU products is
(`engine/kernels/product_route.py`, `chosen_route`), on torch's thread count (the run's) and on one thread,
with --busy spinning processes beside it (a shared machine: another process holding a core).

    python benchmarks/product_choice.py --busy 1 --processes 6

Each of --processes fresh processes measures `faster_by` for each of the three kinds (the forward,
the input gradient, the weight gradient: oneDNN's time over the BLAS's at an update's shapes, the
ways alternating) --repeats times. Prints each kind's ratios, their range, and how many measurements
would have given it oneDNN (ratio at most `MARGIN`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MEASURE = """
import json, sys, torch
from hflow.engine.kernels.product_route import KINDS, faster_by
repeats, threads = int(sys.argv[1]), int(sys.argv[2])
if threads:
    torch.set_num_threads(threads)
print(json.dumps({"threads": torch.get_num_threads(),
                  "ratios": {kind: [faster_by(kind, threads=torch.get_num_threads()) for _ in range(repeats)]
                             for kind in KINDS}}))
"""
SPIN = "while True: pass"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside the measurements")
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each kind per process")
    args = parser.parse_args()
    from hflow.engine.kernels.cpu_products import onednn_available
    from hflow.engine.kernels.product_route import KINDS, MARGIN
    if not onednn_available():
        sys.exit("this torch has no oneDNN: there is no choice to measure")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    try:
        runs = {threads: [json.loads(subprocess.run([sys.executable, "-c", MEASURE, str(args.repeats), str(threads)],
                                                    check=True, capture_output=True, text=True).stdout)
                          for _ in range(args.processes)]
                for threads in (0, 1)}
    finally:
        for spinner in spinners:
            spinner.kill()
    for threads, results in runs.items():
        whose = " (torch's count, the run's)" if not threads else ""
        print(f"on {results[0]['threads']} thread(s){whose}:")
        for kind in KINDS:
            ratios = [r for result in results for r in result["ratios"][kind]]
            onednn = sum(r <= MARGIN for r in ratios)
            print(f"  {kind:12s} oneDNN / BLAS {min(ratios):.2f}-{max(ratios):.2f}; oneDNN chosen in {onednn} of "
                  f"{len(ratios)}: " + " ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
