"""Weight-gradient products through oneDNN (`engine/kernels/cpu_products.py`) with dy^T copied into
rows by torch (inside oneDNN's call) and by the transpose kernel (`engine/kernels/transpose.py`),
side by side in one process: the products alone, at SmolLM2-135M's update shapes by default (1,376
scored positions through the LM head; 1,397 tokens through the layers), with the LM head's forward
whole and in column blocks of its weight (tried, not kept: docs/benchmarks.md); or, with a recipe,
its actor's update, the same batch each round, the kernel turned on and off between calls.

    python benchmarks/transpose_ab.py
    python benchmarks/transpose_ab.py --tokens 2048 --hidden 896 --vocab 151936 --ffn 4864
    python benchmarks/transpose_ab.py --recipe grpo/quickstart --set model.path=... --rounds 10

Prints each way's best and median milliseconds (an update's seconds) over `--rounds`, the ways
alternating, the ratio of the medians, and a product's GFLOP/s; the copies alone too. Under the command's host-memory settings
(`engine/host_memory.py`), as a run: a fresh result comes from the heap, not a new mapping.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import hflow.cli  # noqa: F401,E402  (the command's host-memory and thread settings, before torch loads)
import torch  # noqa: E402
from alternating import report  # noqa: E402

from hflow.engine.kernels import cpu_products, transpose  # noqa: E402
from hflow.engine.kernels.cpu_products import product  # noqa: E402


def _blocked(x: torch.Tensor, weight: torch.Tensor, step: int) -> torch.Tensor:
    """x W^T a block of `step` of the weight's rows (outputs) at a time, into one result."""
    out = x.new_empty(len(x), weight.shape[0])
    for start in range(0, weight.shape[0], step):
        out[:, start:start + step] = product(x, weight[start:start + step])
    return out


def update(recipe_name: str, overrides: list[str], rounds: int) -> None:
    """The actor's update of one batch of the recipe's, the kernel's copies against torch's."""
    from update_profile import _batches

    from hflow.engine.groups.worker import resolve
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.work.bench import _actor

    recipe, _ = load_recipe(recipe_name, ["trainer.eval_every=0", *overrides])
    groups, data = _actor(recipe)
    actor = groups["actor"]
    ways = {"torch copies dy^T": lambda t: t, "kernel copies dy^T": transpose.in_rows}
    try:
        batch = _batches(actor, data, 1, scored=True)[0]

        def call(copy):
            def run():
                cpu_products.in_rows = copy
                resolve(actor.update_actor(batch))
            return run
        report(f"{recipe_name}: the actor's update ({len(batch)} rows), milliseconds",
                {name: call(copy) for name, copy in ways.items()}, rounds, None)
    finally:
        cpu_products.in_rows = transpose.in_rows
        groups.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1376, help="scored positions (the head's rows)")
    parser.add_argument("--layer-tokens", type=int, default=1397, help="tokens through the layers")
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--ffn", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--recipe", help="time this recipe's update instead of the products alone")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    args = parser.parse_args()
    if not cpu_products.onednn_available() or transpose.available() is None:
        raise SystemExit("needs torch's oneDNN and a C compiler (the transpose kernel)")
    if args.recipe:
        return update(args.recipe, args.set, args.rounds)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    g = torch.Generator().manual_seed(0)
    n, h, v = args.tokens, args.hidden, args.vocab
    x, weight = torch.randn(n, h, generator=g), torch.randn(v, h, generator=g)
    dy = torch.randn(n, v, generator=g)
    flops = 2.0 * n * h * v
    report(f"LM head forward ({n} x {h}) x ({h} x {v})",
            {"whole": lambda: product(x, weight), "blocks of 2,048": lambda: _blocked(x, weight, 2048)},
            args.rounds, flops)
    report(f"LM head weight gradient dy^T x, dy ({n} x {v})",
            {"oneDNN copies dy^T": lambda: product(dy.t(), x.t()),
             "kernel copies dy^T": lambda: product(transpose.in_rows(dy.t()), x.t())}, args.rounds, flops)
    report(f"the copy of dy^T alone ({v} x {n})",
            {"torch": lambda: dy.t().contiguous(), "kernel": lambda: transpose.in_rows(dy.t())}, args.rounds, None)
    t = args.layer_tokens
    for out, inner in ((args.ffn, h), (h, args.ffn), (h, h)):
        grad, rows = torch.randn(t, out, generator=g), torch.randn(t, inner, generator=g)
        report(f"layer weight gradient, dy ({t} x {out}), x ({t} x {inner})",
                {"oneDNN copies dy^T": lambda: product(grad.t(), rows.t()),
                 "kernel copies dy^T": lambda: product(transpose.in_rows(grad.t()), rows.t())},
                args.rounds, 2.0 * t * out * inner)


if __name__ == "__main__":
    main()
