"""The decoding step's LM head on a CPU: one `weight @ x` and a transposing copy of its
(vocabulary, rows) result, against the same product in vocabulary slices, each slice turned to
(rows, slice) while it is still in cache (`engine/rollout/fast_decode.py: HEAD_SLICE_ROWS`).

    python benchmarks/decode_head.py --vocab 49152 --hidden 576 --rows 32,16

SmolLM2's head by default. Before every timed call the cache is flushed by products over other
weights, as in a decoding step, where the layers' weights pass through the cache between two heads.
The two ways alternate, and every slice size is timed in each round; milliseconds per call.
"""

from __future__ import annotations

import argparse
import time

import torch


def whole(weight: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return torch.mm(weight, h).t().contiguous()


def sliced(weight: torch.Tensor, h: torch.Tensor, rows: int) -> torch.Tensor:
    logits = h.new_empty(h.shape[1], weight.shape[0])
    for start in range(0, weight.shape[0], rows):
        logits[:, start:start + rows] = torch.mm(weight[start:start + rows], h).t()
    return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--rows", default="32,16", help="decoding rows, a comma list")
    parser.add_argument("--slices", default="1024,2048,4096", help="vocabulary rows a slice, a comma list")
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weight = torch.randn(args.vocab, args.hidden)
    others = [torch.randn(1536, args.hidden) for _ in range(200)]  # 700 MB: more than any cache

    def flush() -> None:
        x = torch.randn(args.hidden, 8)
        for m in others:
            torch.mm(m, x)

    def timed(run, h) -> float:
        total = 0.0
        for _ in range(args.calls):
            flush()
            start = time.perf_counter()
            run(h)
            total += time.perf_counter() - start
        return total / args.calls * 1e3

    slices = [int(s) for s in args.slices.split(",")]
    for rows in (int(r) for r in args.rows.split(",")):
        h = torch.randn(args.hidden, rows)
        for size in slices:
            torch.testing.assert_close(sliced(weight, h, size), whole(weight, h))
        results: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            results.setdefault("whole", []).append(timed(lambda x: whole(weight, x), h))
            for size in slices:
                results.setdefault(f"slices of {size}", []).append(timed(lambda x, s=size: sliced(weight, x, s), h))
        print(f"{rows} rows: " + "; ".join(f"{k} {' '.join(f'{v:.1f}' for v in vs)} ms" for k, vs in results.items()))


if __name__ == "__main__":
    main()
