"""The lean decoding step (`engine/rollout/fast_decode.py`) compiled by `torch.compile` against the
step hflow runs (oneDNN's packed products, eager), in one process, rounds alternating: whether
compiling the step's operators together would close the distance between the decoding step and
its products (docs/benchmarks.md, "The decoding step compiled").

    python benchmarks/decode_compiled.py --model /tmp/m/small --rows 64 --steps 56 --rounds 3 --freeze

The compiled step is the "rows" layout (`F.linear` on the model's own weights: torch's compiler
takes the products itself; with `--freeze` it folds the weights in as constants and packs them for
oneDNN). Shapes are dynamic (the rows and the cache's columns change as a batch decodes). Prints the
seconds the first steps took (the compiling), then each round's median ms a step and the largest
difference between the two's last logits. Needs a C++ compiler (torch's CPU code generation).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from hflow.engine.padding import positions
from hflow.engine.rollout import fast_decode


def decoder(model, ids: torch.Tensor, layout: str, steps: int):
    """A FastDecoder in `layout` on a fresh prefill of `ids`."""
    mask = torch.ones_like(ids)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True)
    chosen = fast_decode.step_layout
    fast_decode.step_layout = lambda weight: layout
    try:
        made = fast_decode.FastDecoder(model, out.past_key_values, mask, steps + 2)
    finally:
        fast_decode.step_layout = chosen
    made.meter = None  # the step's work meter is plain Python around the products: not compiled
    return made


def timed(step, feed: torch.Tensor) -> tuple[list[float], torch.Tensor]:
    times, logits = [], None
    for tokens in feed:
        start = time.perf_counter()
        with torch.no_grad():
            logits = step(tokens)
        times.append(time.perf_counter() - start)
    return times, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--steps", type=int, default=56)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--freeze", action="store_true", help="torch._inductor.config.freezing (weights as constants)")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (a.rows, a.prompt), generator=g)
    feed = torch.randint(0, model.config.vocab_size, (a.steps, a.rows), generator=g)

    import torch._inductor.config as inductor

    inductor.freezing = a.freeze
    compiled = decoder(model, ids, "rows", a.steps)
    step = torch.compile(compiled._step_rows, dynamic=True)
    first, _ = timed(step, feed)
    print(f"first compiled steps (s): {', '.join(f'{t:.2f}' for t in first[:3])}; all {a.steps}: {sum(first):.1f}")
    for r in range(a.rounds):
        eager = decoder(model, ids, "packed", a.steps)
        eager_times, eager_logits = timed(eager.step, feed)
        compiled.__dict__.update(decoder(model, ids, "rows", a.steps).__dict__)  # `step` is bound to this object
        compiled_times, compiled_logits = timed(step, feed)
        print(f"round {r + 1}: eager packed {statistics.median(eager_times) * 1e3:.2f} ms a step, compiled "
              f"{statistics.median(compiled_times) * 1e3:.2f}; last logits differ by at most "
              f"{float((eager_logits - compiled_logits).abs().max()):.1e}")


if __name__ == "__main__":
    main()
