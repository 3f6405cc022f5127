"""A decoding step's products through the thin products' kernel (`engine/kernels/thin_products.c`,
weights in its panels) against oneDNN's (`cpu_products.product` on weights reordered for the rows),
side by side in one process, rounds alternating: every layer's own weights, so that they come from
memory as in a step.

    python benchmarks/thin_products_ab.py --rows 1,4,8,16,32,64
    python benchmarks/thin_products_ab.py --hidden 512 --inter 1536 --kv 512 --layers 8 --vocab 512

The default shapes are SmolLM2-135M's (30 layers: q/k/v joined 960 x 576, o 576 x 576, gate/up
joined 3,072 x 576, down 576 x 1,536; the head 49,152 x 576). Prints each row count's median
milliseconds for all of a step's products both ways and the largest difference from torch's
product. A whole rollout both ways: `benchmarks/decode_attention_ab.py --kernel thin --rollout R`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hflow.engine.kernels import thin_products
from hflow.engine.kernels.cpu_products import packed, product


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="4,16,32")
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--inter", type=int, default=1536)
    parser.add_argument("--kv", type=int, default=192, help="the keys' (and the values') width")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=0, help="torch's thread count (0: torch's own)")
    a = parser.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    kernel = thin_products.available()
    if kernel is None:
        raise SystemExit("the kernel cannot be built here (run with logging at INFO for the reason)")
    h = a.hidden
    shapes = [(h + 2 * a.kv, h), (h, h), (2 * a.inter, h), (h, a.inter)] * a.layers + [(a.vocab, h)]
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(out, inner, generator=g) / inner ** 0.5 for out, inner in shapes]
    panels = [kernel.pack(w) for w in weights]
    for rows in (int(r) for r in a.rows.split(",")):
        reordered = [packed(w, rows) for w in weights]
        xs = {inner: torch.randn(rows, inner, generator=g) for inner in {h, a.inter}}
        ways = {"oneDNN": lambda: [product(xs[w.shape[1]], r) for w, r in zip(weights, reordered)],
                "thin": lambda: [kernel(xs[w.shape[1]], p) for w, p in zip(weights, panels)]}
        error = max(float((kernel(xs[w.shape[1]], p) - xs[w.shape[1]] @ w.t()).abs().max())
                    for w, p in zip(weights, panels))
        times = {way: [] for way in ways}
        for r in range(a.rounds):
            for way in (list(ways) if r % 2 else list(ways)[::-1]):
                start = time.perf_counter()
                ways[way]()
                times[way].append((time.perf_counter() - start) * 1e3)
        before, after = statistics.median(times["oneDNN"]), statistics.median(times["thin"])
        print(f"rows {rows:3d}: oneDNN {before:8.2f} ms  thin {after:8.2f} ms  ({before / after:.2f}x)  "
              f"largest difference from torch's product {error:.1e}")


if __name__ == "__main__":
    main()
