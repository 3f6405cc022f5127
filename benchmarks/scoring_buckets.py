"""The update's scoring pass (forward and backward of `response_log_probs`) four ways, side by
side in one process, rounds alternating:

    python benchmarks/scoring_buckets.py --model models/smollm2-135m-instruct [--response 128]
                                         [--prompts 4] [--n 4] [--rounds 3] [--threads 2]

  whole    every response column through the body and the LM head, one forward (hflow before
           2026-11-26)
  head     one forward, the LM head only where a token is scored (`lm_head.head_at`)
  buckets  rows in length buckets, each forward only as wide as its longest row, and the head
           only where scored (`logprobs.length_buckets`): what `response_log_probs` does for a
           model that cannot pack
  packed   every row's tokens packed into one forward, attention within rows, the head only where
           scored (`training/packed.py`): what it does for Llama and Qwen2/3 since 2026-11-27

The rows are a GRPO micro-batch: --prompts prompts of 35-45 tokens, each sampled --n times, with
responses of uniformly random lengths between half of --response and --response. Prints the
median seconds of each, the ratios, and the buckets chosen. All four give the same log-probs
and gradients (tests/engine/training/test_logprobs.py); this measures only their time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.models.loading import load_causal_lm
from hflow.engine.training import logprobs

PROMPT = 45  # the longest prompt; each is 35-45 tokens


def rollout(prompts: int, n: int, longest: int, vocab: int, seed: int = 0) -> Batch:
    """A rollout-shaped batch: prompts left-padded and shared by their n rows, responses right-padded."""
    g = torch.Generator().manual_seed(seed)
    rows = prompts * n
    prompt_lengths = torch.randint(35, PROMPT + 1, (prompts,), generator=g).repeat_interleave(n)
    response_lengths = torch.randint(longest // 2, longest + 1, (rows,), generator=g)
    ids = torch.randint(vocab // 4, vocab, (rows, PROMPT + longest), generator=g)
    ids[:, :PROMPT] = ids[::n, :PROMPT].repeat_interleave(n, 0)
    mask = torch.zeros(rows, PROMPT + longest, dtype=torch.long)
    for r in range(rows):
        mask[r, PROMPT - prompt_lengths[r]:PROMPT + response_lengths[r]] = 1
    return Batch({"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:],
                  "response_mask": mask[:, PROMPT:].clone()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a Hugging Face model directory (a Llama or Qwen2)")
    parser.add_argument("--response", type=int, default=128, help="the longest response")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    model = load_causal_lm(a.model, torch.float32)
    batch = rollout(a.prompts, a.n, a.response, model.config.vocab_size)
    mask = batch["response_mask"]
    can_head_at, can_pack = logprobs.can_head_at, logprobs.can_pack
    overhead = dict(logprobs.BUCKET_OVERHEAD_TOKENS)

    def use(way: str) -> None:
        logprobs.can_head_at = (lambda forward: False) if way == "whole" else can_head_at
        logprobs.can_pack = can_pack if way == "packed" else (lambda forward: False)
        logprobs.BUCKET_OVERHEAD_TOKENS.update(overhead if way == "buckets" else {"cpu": 10**9, "cuda": 10**9})

    def once() -> float:
        start = time.perf_counter()
        log_probs, _ = logprobs.response_log_probs(model, batch, 1.0)
        (log_probs * mask).sum().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    ways = ["whole", "head", "buckets", "packed"]
    times: dict[str, list[float]] = {way: [] for way in ways}
    for way in ways:  # warm-up
        use(way)
        once()
    for i in range(a.rounds):
        for way in ways if i % 2 == 0 else ways[::-1]:
            use(way)
            times[way].append(once())
    use("buckets")
    widths = logprobs.last_scored(mask[:, 1:].bool()) + 1
    buckets = [(len(rows), width) for rows, width in logprobs.length_buckets(widths, "cpu")]
    print(f"{len(mask)} rows, responses {mask.sum(-1).tolist()}; buckets (rows, width): {buckets}")
    for way in ways:
        print(f"{way:8} median {statistics.median(times[way]):.3f} s  {[round(t, 3) for t in times[way]]}")
    for way in ways[1:]:
        print(f"whole / {way}: {statistics.median(times['whole']) / statistics.median(times[way]):.2f}x")
    print(f"buckets / packed: {statistics.median(times['buckets']) / statistics.median(times['packed']):.2f}x")


if __name__ == "__main__":
    main()
