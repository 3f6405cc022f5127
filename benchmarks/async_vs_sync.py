"""Tokens per second of the same recipe in `trainer.mode: sync` and `trainer.mode: async`.

    python benchmarks/async_vs_sync.py [--recipe grpo/tiny_async] [--steps 20] [--rounds 3]
                                       [--max-staleness 1] [--model DIR] [--threads N]

Each round runs the recipe once per mode, the modes alternating (sync, async, sync, async, ...)
so that both see the machine in the same state; all in this one process, one after another.
A run's throughput is its tokens (prompt + response, every step after the first, which warms
up) over the wall time of those steps, the rollouts' waits included: what a user gets per
second. Without --model a tiny Llama is built in a temporary directory (as the quickstart's).
The off-policy correction and every other key stay the recipe's in both modes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

from hflow.cli.quiet import quiet_libraries
from hflow.engine.models.loading import build_tiny_model
from hflow.trainer.algorithms.registry import trainer_for
from hflow.trainer.config.load import load_recipe
from hflow.trainer.rundir.writer import RunDir


def tokens_per_s(recipe_name: str, mode: str, args, model: str, out: str) -> float:
    recipe, _ = load_recipe(recipe_name, [f"model.path={model}", "model.init=null", f"trainer.mode={mode}",
                                          f"trainer.max_staleness={args.max_staleness}",
                                          f"trainer.total_steps={args.steps}", "trainer.save_every=0",
                                          "logging.progress=lines", "logging.wandb.enabled=false"])
    recipe.name = f"bench-{mode}"
    run = RunDir.create(recipe, out)
    try:
        trainer_for(recipe.algorithm)(recipe, run)
    finally:
        run.close()
    events = [e for e in run.events() if e["step"] >= 2]  # step 1 warms up (and has nothing to overlap)
    tokens = sum(e["throughput/tokens_per_s"] * e["timing/step"] for e in events)
    return tokens / sum(e["timing/step"] for e in events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="grpo/tiny_async")
    parser.add_argument("--steps", type=int, default=20, help="RL steps per run (at least 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--model", help="a model directory (default: a tiny Llama built here)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is left out as warm-up)")
    quiet_libraries()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows: dict[str, list[float]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_tiny_model(f"{tmp}/tiny"))
        for _ in range(args.rounds):
            for mode in ("sync", "async"):
                rows[mode].append(tokens_per_s(args.recipe, mode, args, model, tmp))
    print(f"{args.recipe}, {args.steps} steps per run, max_staleness {args.max_staleness}, "
          f"{args.rounds} rounds (modes alternating)")
    print(f"{'round':<7}{'sync tok/s':>12}{'async tok/s':>13}{'speed-up':>10}")
    for i, (s, a) in enumerate(zip(rows["sync"], rows["async"]), 1):
        print(f"{i:<7}{s:>12.1f}{a:>13.1f}{a / s:>9.2f}x")
    sync, async_ = statistics.median(rows["sync"]), statistics.median(rows["async"])
    print(f"{'median':<7}{sync:>12.1f}{async_:>13.1f}{async_ / sync:>9.2f}x")


if __name__ == "__main__":
    main()
