"""torch's BLAS against oneDNN on this CPU's float32 matrix products (`engine/kernels/cpu_products.py`).

    python benchmarks/cpu_products.py [--model models/smollm2-135m-instruct] [--tokens 4096] [--rows 12,16,24,32]

Three tables, each product timed both ways, rounds alternating, the best of --rounds:
  1. a 1024^3 product (the machine's large-matrix rate);
  2. the update's three products of one layer at the model's MLP shape, --tokens rows: the forward
     x W^T, the input gradient dy W and the weight gradient dy^T x (as the routed layer computes
     them), with each way's largest error against float64, relative to the result's largest value;
  3. a decoding step's products (every layer's four, q/k/v and gate/up joined as the lean step joins
     them, each weight its own tensor so that the cache is cold as in a step) at each of --rows
     rows: the BLAS as the lean step calls it without oneDNN (`weight @ x` from 12 rows, `F.linear`
     below), oneDNN on the plain weights, and oneDNN on weights reordered for the rows
     (`cpu_products.packed`, what the step takes wherever oneDNN runs); milliseconds per step.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hflow.engine.kernels.cpu_products import onednn_available, packed, product


def best_s(run, rounds: int) -> float:
    run()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


def update_products(hidden: int, ffn: int, tokens: int, rounds: int) -> None:
    torch.manual_seed(0)
    x, w, dy = torch.randn(tokens, hidden), torch.randn(ffn, hidden) * 0.05, torch.randn(tokens, ffn)
    flops = 2.0 * tokens * hidden * ffn
    ways = {  # name: (BLAS, oneDNN, float64 reference)
        "forward x W^T": (lambda: F.linear(x, w), lambda: product(x, w), lambda: x.double() @ w.double().t()),
        "input grad dy W": (lambda: dy @ w, lambda: product(dy, w.t()), lambda: dy.double() @ w.double()),
        "weight grad dy^T x": (lambda: dy.t() @ x, lambda: product(dy.t(), x.t()),
                               lambda: dy.double().t() @ x.double()),
    }
    print(f"\nthe update's products, ({tokens} x {hidden}) and ({ffn} x {hidden}):")
    print(f"{'product':22}{'BLAS GFLOP/s':>14}{'oneDNN GFLOP/s':>16}{'BLAS error':>12}{'oneDNN error':>14}")
    for name, (blas, dnn, ref) in ways.items():
        want = ref()
        rates = [flops / best_s(f, rounds) / 1e9 for f in (blas, dnn)]
        errors = [relative_error(f(), want) for f in (blas, dnn)]
        print(f"{name:22}{rates[0]:>14.0f}{rates[1]:>16.0f}{errors[0]:>12.1e}{errors[1]:>14.1e}")


def decode_products(config: dict, rows_list: list[int], rounds: int) -> None:
    hidden, ffn, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv = (config.get("num_key_value_heads") or heads) * (config.get("head_dim") or hidden // heads)
    # The lean step's four products a layer: q/k/v joined, o, gate/up joined, down.
    shapes = [(hidden + 2 * kv, hidden), (hidden, hidden), (2 * ffn, hidden), (hidden, ffn)]
    weights = [torch.randn(*shape) * 0.02 for _ in range(layers) for shape in shapes]
    print(f"\na decoding step's {len(weights)} products, q/k/v and gate/up joined (ms per step):")
    print(f"{'rows':>6}{'BLAS weight @ x':>17}{'BLAS F.linear':>15}{'oneDNN':>10}{'oneDNN packed':>15}")
    for rows in rows_list:
        columns = {w.shape[1]: torch.randn(w.shape[1], rows) for w in weights}
        row_major = {k: v.t().contiguous() for k, v in columns.items()}
        reordered = [packed(w, rows) for w in weights]
        times = [best_s(run, rounds) * 1e3 for run in (
            lambda: [torch.mm(w, columns[w.shape[1]]) for w in weights],
            lambda: [F.linear(row_major[w.shape[1]], w) for w in weights],
            lambda: [product(row_major[w.shape[1]], w) for w in weights],
            lambda: [product(row_major[w.shape[1]], p) for w, p in zip(weights, reordered)])]
        print(f"{rows:>6}{times[0]:>17.1f}{times[1]:>15.1f}{times[2]:>10.1f}{times[3]:>15.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/smollm2-135m-instruct", help="a model directory (its config.json)")
    parser.add_argument("--tokens", type=int, default=4096, help="rows of the update's products")
    parser.add_argument("--rows", default="12,16,24,32", help="decoding batch rows, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    a = parser.parse_args()
    if not onednn_available():
        raise SystemExit("this torch has no oneDNN: nothing to compare")
    config = json.loads((Path(a.model) / "config.json").read_text())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32")
    size = 1024
    a1, b1 = torch.randn(size, size), torch.randn(size, size)
    w1 = b1.t().contiguous()
    blas, dnn = (2.0 * size**3 / best_s(run, a.rounds) / 1e9 for run in (lambda: a1 @ b1, lambda: product(a1, w1)))
    print(f"1024^3 product: BLAS {blas:.0f} GFLOP/s, oneDNN {dnn:.0f} GFLOP/s")
    update_products(config["hidden_size"], config["intermediate_size"], a.tokens, a.rounds)
    decode_products(config, [int(r) for r in a.rows.split(",")], a.rounds)


if __name__ == "__main__":
    main()
