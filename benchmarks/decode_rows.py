"""The decoding batch's row count on a CPU: how fast a decoding step's weight products run at each
count of rows, and what that means for when finished rows leave the batch.

    python benchmarks/decode_rows.py [--model models/smollm2-135m-instruct] [--rows 12-32] [--rounds 4]

First the step's products alone: every layer's seven `weight @ x` products (SmolLM2's shapes by
default, from the model's config), each weight its own tensor so that the cache is cold as in a
decoding step, at each row count; milliseconds per step. Then `grpo/smollm2-arithmetic`'s
generation (its first prompt batches, n = 4, 48 tokens) three ways, rounds alternating in one
process: finished rows dropped a quarter of the batch at a time, at once, or down to a multiple of
`fast_decode.CPU_ROW_MULTIPLE` rows (what the lean step does); the same samples every way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def product_ms(config: dict, rows: int, repeats: int = 8) -> float:
    hidden, ffn, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv = (config.get("num_key_value_heads") or heads) * (config.get("head_dim") or hidden // heads)
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (ffn, hidden), (ffn, hidden), (hidden, ffn)]
    weights = [torch.randn(*shape) for _ in range(layers) for shape in shapes]
    inputs = {hidden: torch.randn(hidden, rows), ffn: torch.randn(ffn, rows)}

    def step():
        for w in weights:
            torch.mm(w, inputs[w.shape[1]])

    step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats * 1e3


def generation(rounds: int) -> dict[str, list[float]]:
    from hflow.engine.models.loading import eos_token_ids, load_causal_lm, load_tokenizer
    from hflow.engine.rollout.fast_decode import FastDecoder
    from hflow.engine.rollout.generation import ForwardDecoder, HFGenerator, SamplingParams
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.data.prompts import PromptData

    recipe, _ = load_recipe("grpo/smollm2-arithmetic", [])
    tokenizer = load_tokenizer(recipe.model.path)
    data = PromptData(recipe.data, tokenizer, recipe.seed, recipe.trainer.prompts_per_step)
    model = load_causal_lm(recipe.model.path, torch.float32).eval()
    generator = HFGenerator(model, eos_token_ids(model, tokenizer), tokenizer.pad_token_id, 64)
    lean = FastDecoder.batch_rows
    ways = {"quarter": lambda self, live, batch: ForwardDecoder.batch_rows(live, batch),
            "at once": lambda self, live, batch: live, "multiple": lean}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    try:
        for i in range(rounds + 1):
            for way in list(ways) if i % 2 == 0 else list(ways)[::-1]:
                FastDecoder.batch_rows = ways[way]
                for step in (1, 2):
                    start = time.perf_counter()
                    generator.generate(data.batch(step)["prompt_ids"], recipe.rollout.n, SamplingParams(48),
                                       torch.Generator().manual_seed(step))
                    if i:  # the first round warms up
                        seconds[way].append(time.perf_counter() - start)
    finally:
        FastDecoder.batch_rows = lean
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--rows", default="12-32", help="a range of row counts, first-last")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    config = json.loads((Path(a.model) / "config.json").read_text())
    first, last = (int(x) for x in a.rows.split("-"))
    print("rows  products ms a step")
    for rows in range(last, first - 1, -1):
        print(f"{rows:4d}  {product_ms(config, rows):8.1f}")
    for way, values in generation(a.rounds).items():
        print(f"generation, rows leaving {way:8}: median {statistics.median(values):.3f} s  {[round(v, 2) for v in values]}")


if __name__ == "__main__":
    main()
