"""The decoding step's attention through the compiled kernel (`engine/kernels/decode_attention.c`)
against torch's products (`RowCache`'s eager path), side by side in one process, rounds alternating.

    python benchmarks/decode_attention_ab.py --threads 2
    python benchmarks/decode_attention_ab.py --rollout grpo/quickstart --set model.path=/tmp/m/small ...

Without `--rollout`: the attention alone at the shapes of the 3.5M, 27.5M and SmolLM2 models'
decoding steps (every layer's own keys and values, so the cache is cold as in a step), milliseconds
for all the layers of one step, and the time of one plain read of the same keys and values (`sum`,
the memory's rate: the limit). With `--rollout RECIPE`: the recipe's own rollouts (`--set` as for
`hflow train`), the kernel turned off and on between calls; seconds per rollout. `--kernel step`
turns the step's element-wise kernels (`layers.c`) off and on instead, `--kernel append` the
cache's append inside the attention's kernel (torch's copy first instead), `--kernel thin` the
step's products' kernel (`thin_products.c`; oneDNN's products instead). With `--before REV`, the
kernel as it was at a git revision (built here from that revision's source) takes torch's place:

    python benchmarks/decode_attention_ab.py --before HEAD~1
    python benchmarks/decode_attention_ab.py --before HEAD~1 --rollout grpo/smollm2-arithmetic --set model.path=...
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

# name: rows, key-value heads, query heads per key-value head, head width, columns read, layers
SHAPES = {
    "3.5M, 64 rows, 40 columns": (64, 8, 1, 32, 40, 4),
    "3.5M, 64 rows, 70 columns": (64, 8, 1, 32, 70, 4),
    "27.5M, 64 rows, 40 columns": (64, 8, 1, 64, 40, 8),
    "SmolLM2, 32 rows, 70 columns": (32, 3, 3, 64, 70, 30),
    "27.5M, 16 rows, 1,000 columns": (16, 8, 1, 64, 1000, 8),
}


def _eager(q, keys, values, mask, end, scale):
    scores = torch.matmul(q * scale, keys[:, :, :end].transpose(-1, -2)).add_(mask[..., :end])
    return torch.matmul(scores.softmax(-1), values[:, :, :end])


def kernel_at(revision: str):
    """The attention kernel as it was at `revision`: its source and the folder's headers then, built
    here with the flags and OpenMP runtime hflow builds with (`engine/kernels/build.py`)."""
    from hflow.engine.kernels import build, decode_attention

    root, folder = Path(__file__).resolve().parents[1], Path(tempfile.mkdtemp())
    listed = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:engine/kernels"], cwd=root, check=True,
                            capture_output=True, text=True).stdout.split()
    for name in [n for n in listed if n.endswith(".h")] + ["decode_attention.c"]:
        (folder / name).write_text(subprocess.run(["git", "show", f"{revision}:engine/kernels/{name}"], cwd=root,
                                                  check=True, capture_output=True, text=True).stdout)
    openmp = build.openmp_runtime()
    subprocess.run([build.compiler(), *build.FLAGS, str(folder / "decode_attention.c"), "-o", str(folder / "k.so"),
                    str(openmp), f"-Wl,-rpath,{openmp.parent}", "-lm"], check=True)
    return decode_attention.DecodeAttention(ctypes.CDLL(str(folder / "k.so")))


def attention(rounds: int, before) -> None:
    from hflow.engine.kernels import decode_attention

    kernel = decode_attention.available()
    if kernel is None:
        raise SystemExit("the kernel could not be built here (run with logging at INFO for the reason)")
    other = "before" if before is not None else "torch"
    for name, (rows, heads, group, width, end, layers) in SHAPES.items():
        capacity = end + 16
        caches = [(torch.randn(rows, heads, group, width), torch.randn(rows, heads, capacity, width),
                   torch.randn(rows, heads, capacity, width)) for _ in range(layers)]
        mask = torch.zeros(rows, 1, 1, capacity)
        mask[::2, ..., :3] = float("-inf")
        ways = {other: before or _eager, "kernel": kernel,
                "read": lambda q, k, v, m, e, s: (k[:, :, :e].sum(), v[:, :, :e].sum())}
        times = {way: [] for way in ways}
        for r in range(rounds):
            for way in (list(ways) if r % 2 else list(ways)[::-1]):
                start = time.perf_counter()
                for q, keys, values in caches:
                    ways[way](q, keys, values, mask, end, width ** -0.5)
                times[way].append((time.perf_counter() - start) * 1e3)
        eager, fused, read = (statistics.median(times[w]) for w in (other, "kernel", "read"))
        print(f"{name:32s} {other} {eager:7.3f} ms  kernel {fused:7.3f} ms  ({eager / fused:.2f}x)  "
              f"plain read {read:7.3f} ms (kernel at {read / fused:.0%} of it)")


def rollout(recipe_name: str, overrides: list[str], rounds: int, which: str, before) -> None:
    import hflow.cli  # noqa: F401  (the command's host-memory and thread settings)
    from hflow.engine.groups.worker import resolve
    from hflow.engine.kernels import decode_attention, layers
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.work.bench import _actor

    switches = _switches(which, decode_attention, layers)  # (owner, name, the "torch" value)
    if before is not None:
        switches = [(decode_attention, "available", lambda: before)]
    kept = [getattr(owner, name) for owner, name, _ in switches]
    recipe, _ = load_recipe(recipe_name, ["trainer.eval_every=0", *overrides])
    groups, data = _actor(recipe)
    actor = groups["actor"]
    resolve(actor.generate_sequences(data.batch(1)))  # warm-up
    other = "before" if before is not None else "torch"
    times = {other: [], "kernel": []}
    for r in range(rounds):
        for way in ((other, "kernel") if r % 2 else ("kernel", other)):
            for (owner, name, off), on in zip(switches, kept):
                setattr(owner, name, on if way == "kernel" else off)
            start = time.perf_counter()
            resolve(actor.generate_sequences(data.batch(2 + r)))
            times[way].append(time.perf_counter() - start)
    for (owner, name, _), on in zip(switches, kept):
        setattr(owner, name, on)
    for way, seconds in times.items():
        print(f"{way:6s} median {statistics.median(seconds):.3f} s  ({', '.join(f'{s:.3f}' for s in seconds)})")
    print(f"kernel faster by {statistics.median(times[other]) / statistics.median(times['kernel']):.3f}x")


def _switches(which: str, decode_attention, layers) -> list[tuple]:
    """What turns `which` off: the attention's kernel, the step's element-wise kernels, or the cache's
    append inside the attention's kernel (appended by torch first instead)."""
    if which == "thin":
        from hflow.engine.kernels import thin_products

        return [(thin_products, "available", lambda: None)]
    if which != "append":
        return [(decode_attention if which == "attention" else layers, "available", lambda: None)]
    from hflow.engine.rollout.decode_cache import RowCache, SharedPromptCache

    def apart(cache, i, q, k, v, scale):
        cache.append(i, k, v)
        return cache.attention(q, i, scale)

    return [(RowCache, "append_and_attend", apart), (SharedPromptCache, "append_and_attend", apart)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch's thread count (0: torch's own)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rollout", metavar="RECIPE", help="time the recipe's rollouts instead")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--before", metavar="REV", help="the attention's kernel at this git revision in torch's place")
    parser.add_argument("--kernel", choices=("attention", "step", "append", "thin"), default="attention",
                        help="with --rollout, the kernel turned off and on: the attention's (decode_attention.c), "
                        "the step's element-wise work (layers.c; the attention's kernel stays on), the "
                        "cache's append inside the attention's kernel, or the step's products (thin_products.c; "
                        "off: oneDNN's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    before = kernel_at(args.before) if args.before else None
    if args.rollout:
        rollout(args.rollout, args.set, args.rounds, args.kernel, before)
    else:
        attention(args.rounds, before)


if __name__ == "__main__":
    main()
