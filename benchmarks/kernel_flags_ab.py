"""The decoding step's attention kernel built with and without one compiler flag (default
`-fno-trapping-math`, which lets the exponential's `floorf` become a vector instruction so that its
loop vectorizes), side by side in one process at `decode_attention_ab.py`'s shapes, rounds
alternating; milliseconds for all the layers of one step, medians.

    python benchmarks/kernel_flags_ab.py [--flag -fno-trapping-math] [--rounds 15]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from decode_attention_ab import SHAPES  # noqa: E402
from hflow.engine.kernels import build, decode_attention  # noqa: E402


def built(flags: list[str], folder: str) -> decode_attention.DecodeAttention:
    runtime = build.openmp_runtime()
    out = str(Path(folder) / f"attention-{len(flags)}.so")
    subprocess.run([build.compiler(), *flags, str(build.SOURCES / "decode_attention.c"), "-o", out, str(runtime),
                    f"-Wl,-rpath,{runtime.parent}", "-lm"], check=True)
    return decode_attention.DecodeAttention(ctypes.CDLL(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flag", default="-fno-trapping-math")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    without = [f for f in build.FLAGS if f != args.flag]
    with tempfile.TemporaryDirectory() as folder:
        kernels = {"without": built(without, folder), "with": built([*without, args.flag], folder)}
        for name, (rows, heads, group, width, end, layers) in SHAPES.items():
            data = [(torch.randn(rows, heads, group, width), torch.randn(rows, heads, end, width),
                     torch.randn(rows, heads, end, width)) for _ in range(layers)]
            mask = torch.zeros(rows, 1, 1, end)
            times = {way: [] for way in kernels}
            for r in range(args.rounds):
                for way in ("without", "with") if r % 2 else ("with", "without"):
                    start = time.perf_counter()
                    for q, keys, values in data:
                        kernels[way](q, keys, values, mask, end, 0.125)
                    times[way].append((time.perf_counter() - start) * 1e3)
            a, b = statistics.median(times["without"]), statistics.median(times["with"])
            print(f"{name:32s} without {args.flag} {a:7.3f} ms, with it {b:7.3f} ms ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
