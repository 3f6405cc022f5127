"""How steady the measurement that picks oneDNN or the BLAS for a run's CPU products is
(`engine/cpu_products.py`, `onednn_chosen`), timed on torch's thread count and on one thread, with
--busy spinning processes beside it (a shared machine: another process holding a core).

    python benchmarks/product_choice.py --busy 1 --processes 6

Each of --processes fresh processes measures `faster_by` (oneDNN's best time over the BLAS's on a
256 x 1024 x 1024 float32 product, 5 rounds alternating) --repeats times each way. Prints the
ratios, their range, and how many measurements would have chosen the BLAS (ratio above `MARGIN`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MEASURE = """
import json, sys, torch
import torch.nn.functional as F
from hflow.engine.cpu_products import faster_by, product
repeats = int(sys.argv[1])
team = torch.get_num_threads()
print(json.dumps({"team": team,
                  "team_ratios": [faster_by(product, F.linear, threads=team) for _ in range(repeats)],
                  "one_ratios": [faster_by(product, F.linear, threads=1) for _ in range(repeats)]}))
"""
SPIN = "while True: pass"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside the measurements")
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=4, help="measurements per process, each way")
    args = parser.parse_args()
    from hflow.engine.cpu_products import MARGIN, onednn_available
    if not onednn_available():
        sys.exit("this torch has no oneDNN: there is no choice to measure")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    try:
        results = [json.loads(subprocess.run([sys.executable, "-c", MEASURE, str(args.repeats)], check=True,
                                             capture_output=True, text=True).stdout)
                   for _ in range(args.processes)]
    finally:
        for spinner in spinners:
            spinner.kill()
    for key, title in (("team_ratios", f"on {results[0]['team']} threads"), ("one_ratios", "on one thread")):
        ratios = [r for result in results for r in result[key]]
        blas = sum(r > MARGIN for r in ratios)
        print(f"{title:16s} oneDNN / BLAS {min(ratios):.2f}-{max(ratios):.2f}; the BLAS chosen in {blas} of "
              f"{len(ratios)}: " + " ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
