"""A recipe's update with its RMSNorms and SwiGLU MLPs fused (`engine/models/fused_layers.py`) against
transformers' own modules, side by side in one process: the same batches, the fused path turned off
and on between calls, rounds alternating; seconds per call and the ratio of the medians.

    python benchmarks/fused_layers_ab.py grpo/quickstart --set model.path=/tmp/m/medium --set model.init=null ...
    python benchmarks/fused_layers_ab.py grpo/smollm2-arithmetic --phase score --rounds 6
    python benchmarks/fused_layers_ab.py --alone

`--phase score` times `compute_log_prob` (a forward) instead of `update_actor`. `--alone` times
one RMSNorm's and one SwiGLU's forward and backward alone instead, transformers' modules against
the fused ones, at the 27.5M model's update (3,693 tokens) and SmolLM2's (950 and 1,892 tokens;
milliseconds, medians of 9).
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


ALONE = {"27.5M, 3,693 tokens": (3693, 512, 1536), "SmolLM2, 950 tokens": (950, 576, 1536),
         "SmolLM2, 1,892 tokens": (1892, 576, 1536)}  # tokens, hidden, MLP width


def _ms(run, calls: int = 10) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(9):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def alone() -> None:
    import copy

    import torch
    import torch.nn.functional as F
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    kernels = fused_layers.layers.available()
    for name, (tokens, hidden, width) in ALONE.items():
        norm = LlamaRMSNorm(hidden)
        fused = copy.deepcopy(norm)
        fused_layers.fuse_layers(fused)
        x, dy = torch.randn(1, tokens, hidden, requires_grad=True), torch.randn(1, tokens, hidden)
        gate, up = (torch.randn(1, tokens, width, requires_grad=True) for _ in range(2))
        dout = torch.randn(1, tokens, width)
        norms = _ms(lambda: norm(x).backward(dy)), _ms(lambda: fused(x).backward(dy))
        mlps = (_ms(lambda: (F.silu(gate) * up).backward(dout)),
                _ms(lambda: fused_layers._SiluTimes.apply(gate, up, kernels).backward(dout)))
        print(f"{name:24s} RMSNorm forward + backward {norms[0]:6.2f} -> {norms[1]:5.2f} ms "
              f"({norms[0] / norms[1]:.2f}x)   SwiGLU {mlps[0]:6.2f} -> {mlps[1]:5.2f} ms ({mlps[0] / mlps[1]:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?")
    parser.add_argument("--alone", action="store_true", help="the modules alone (no recipe)")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    parser.add_argument("--phase", default="update", choices=["update", "score"])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if args.alone:
        return alone()
    if args.recipe is None:
        parser.error("a recipe, or --alone")
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
