"""A recipe's update with its RMSNorms and SwiGLU MLPs fused (`engine/models/fused_layers.py`) against
transformers' own modules, side by side in one process: the same batches, the fused path turned off
and on between calls, rounds alternating; seconds per call and the ratio of the medians.

    python benchmarks/fused_layers_ab.py grpo/quickstart --set model.path=/tmp/m/medium --set model.init=null ...
    python benchmarks/fused_layers_ab.py grpo/smollm2-arithmetic --phase score --rounds 6

`--phase score` times `compute_log_prob` (a forward) instead of `update_actor`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import hflow.cli  # noqa: E402,F401  (the command's host-memory and thread settings)
from hflow.engine.groups.worker import resolve  # noqa: E402
from hflow.engine.models import fused_layers  # noqa: E402
from hflow.trainer.config.load import load_recipe  # noqa: E402
from hflow.trainer.work.bench import _actor  # noqa: E402
from update_profile import _batches  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    parser.add_argument("--phase", default="update", choices=["update", "score"])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    recipe, _ = load_recipe(args.recipe, ["trainer.eval_every=0", *args.set])
    groups, data = _actor(recipe)
    actor = groups["actor"]
    call = actor.update_actor if args.phase == "update" else actor.compute_log_prob
    kernels = fused_layers.layers.available
    try:
        batches = _batches(actor, data, 2, scored=args.phase == "update")
        resolve(call(batches[0]))  # warm-up: the optimizer's state allocated
        times = {"modules": [], "fused": []}
        for r in range(args.rounds):
            for way in ("modules", "fused") if r % 2 else ("fused", "modules"):
                fused_layers.layers.available = kernels if way == "fused" else (lambda: None)
                start = time.perf_counter()
                resolve(call(batches[1]))
                times[way].append(time.perf_counter() - start)
    finally:
        fused_layers.layers.available = kernels
        groups.shutdown()
    for way, seconds in times.items():
        print(f"{way:8s} median {statistics.median(seconds):.3f} s  ({', '.join(f'{s:.3f}' for s in seconds)})")
    print(f"fused faster by {statistics.median(times['modules']) / statistics.median(times['fused']):.3f}x")


if __name__ == "__main__":
    main()
