"""A packed batch's attention through the compiled grid kernel (`engine/kernels/grid_attention.c`)
against torch's `scaled_dot_product_attention`, side by side in one process, rounds alternating.

    python benchmarks/grid_attention_ab.py
    python benchmarks/grid_attention_ab.py --phase update --recipe grpo/smollm2-arithmetic --set model.path=...

Without `--phase`: the attention alone, forward and forward plus backward, at grid shapes of the
3.5M, 27.5M and SmolLM2 models' micro-batches (each row's queries against its prompt's keys and its
own, causally), milliseconds a call and the rate of the FLOPs the attended (query, key) pairs need
(4 x head width each forward, 10 x with the backward's recomputed scores). With `--phase update`
(or `score`): a recipe's own actor update (or old-policy scoring) on its own rollouts, the kernel
turned off and on between calls on each batch; seconds a call and each round's ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

# name: rows, query heads, key-value heads, queries (a row's response), keys before them (its prompt), head width
SHAPES = {
    "3.5M, 64 rows x 40 after 70": (64, 8, 8, 40, 70, 32),
    "27.5M, 64 rows x 40 after 70": (64, 8, 8, 40, 70, 64),
    "SmolLM2, 32 rows x 47 after 45": (32, 9, 3, 47, 45, 64),
    "SmolLM2 prompts, 8 x 45 causal": (8, 9, 3, 45, 0, 64),
    "27.5M, 16 rows x 256 after 64": (16, 8, 8, 256, 64, 64),
}


def _inputs(rows, heads, kv_heads, queries, before, width):
    keys = before + queries
    q = torch.randn(rows, heads, queries, width, requires_grad=True)
    k, v = (torch.randn(rows, kv_heads, keys, width, requires_grad=True) for _ in range(2))
    mask = None
    if before:
        mask = (torch.arange(keys)[None] <= torch.arange(queries)[:, None] + before)[None, None]
        mask = mask.expand(rows, 1, -1, -1).contiguous()
    pairs = rows * heads * sum(min(i + before + 1, keys) for i in range(queries))
    return q, k, v, mask, pairs


def attention_alone(rounds: int) -> None:
    from hflow.engine.kernels import grid_attention

    kernel = grid_attention.available()
    if kernel is None:
        raise SystemExit("the kernel could not be built here (run with logging at INFO for the reason)")
    for name, shape in SHAPES.items():
        q, k, v, mask, pairs = _inputs(*shape)
        causal = mask is None
        grad = torch.randn_like(q)
        ways = {
            "torch": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True),
            "kernel": lambda: grid_attention.attention(kernel, q, k, v, mask, causal),
        }
        times = {(w, p): [] for w in ways for p in ("forward", "backward")}
        for r in range(rounds + 2):
            for way in (("torch", "kernel") if r % 2 else ("kernel", "torch")):
                with torch.no_grad():
                    start = time.perf_counter()
                    ways[way]()
                    forward = time.perf_counter() - start
                start = time.perf_counter()
                ways[way]().backward(grad)
                both = time.perf_counter() - start
                if r >= 2:  # two warm-up rounds
                    times[way, "forward"].append(forward)
                    times[way, "backward"].append(both)
        ms = {key: statistics.median(t) * 1e3 for key, t in times.items()}
        width = shape[-1]
        print(f"{name:32s} forward: torch {ms['torch', 'forward']:6.2f} ms, kernel {ms['kernel', 'forward']:6.2f} "
              f"({ms['torch', 'forward'] / ms['kernel', 'forward']:.2f}x, {4 * width * pairs / ms['kernel', 'forward'] / 1e6:5.1f} "
              f"GFLOP/s); with backward: torch {ms['torch', 'backward']:6.2f}, kernel {ms['kernel', 'backward']:6.2f} "
              f"({ms['torch', 'backward'] / ms['kernel', 'backward']:.2f}x, "
              f"{10 * width * pairs / ms['kernel', 'backward'] / 1e6:5.1f} GFLOP/s)")


def phase(recipe_name: str, overrides: list[str], which: str, rounds: int) -> None:
    import hflow.cli  # noqa: F401  (the command's host-memory and thread settings)
    from hflow.engine.groups.worker import resolve
    from hflow.engine.kernels import grid_attention
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.work.bench import _actor
    from update_profile import _batches, _call

    kept = grid_attention.available
    recipe, _ = load_recipe(recipe_name, ["trainer.eval_every=0", *overrides])
    groups, data = _actor(recipe)
    try:
        actor = groups["actor"]
        batches = _batches(actor, data, rounds + 1, scored=which == "update")
        _call(actor, which, batches[0], data, 0)  # warm-up (the optimizer's state allocated)
        times = {"torch": [], "kernel": []}
        for r, batch in enumerate(batches[1:]):
            for way in (("torch", "kernel") if r % 2 else ("kernel", "torch")):
                grid_attention.available = kept if way == "kernel" else (lambda: None)
                start = time.perf_counter()
                _call(actor, which, batch, data, 0)
                times[way].append(time.perf_counter() - start)
    finally:
        grid_attention.available = kept
        groups.shutdown()
    for way, seconds in times.items():
        print(f"{way:6s} median {statistics.median(seconds):.3f} s  ({', '.join(f'{s:.3f}' for s in seconds)})")
    # Each round's two calls are on the same batch, one after the other: their ratio is the fair
    # comparison (the batches' sizes differ, and so does the machine's speed between rounds).
    ratios = [a / b for a, b in zip(times["torch"], times["kernel"])]
    print(f"kernel faster by {statistics.geometric_mean(ratios):.3f}x (geometric mean of the rounds' ratios: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}; faster in {sum(r > 1 for r in ratios)} of {len(ratios)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("update", "score"), help="a recipe's actor phase instead of the attention alone")
    parser.add_argument("--recipe", default="grpo/smollm2-arithmetic")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=0, help="torch's threads (0: as hflow sets them)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.phase:
        phase(args.recipe, args.set, args.phase, args.rounds)
    else:
        attention_alone(args.rounds)


if __name__ == "__main__":
    main()
