"""Asking a causal LM's forward for only the logits that are used.

The LM head's output is (rows, positions, vocab): with a large vocabulary it is most of a
forward's memory (Qwen2.5's 151,936 tokens: 32 prompts x 512 positions in bfloat16 are about
5 GB). transformers' causal LMs take `logits_to_keep`, which runs the head on the last
positions only; generation's prefill needs one, scoring the responses only theirs. Shared by
the rollout (`rollout/generation.py`) and training (`training/logprobs.py`) sides, so that
neither imports the other for it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch


@functools.cache
def _takes_logits_to_keep(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def model_behind(forward: Callable):
    """The model behind `forward`: a bound method (DeepSpeed's) or the model; with LoRA, peft's
    base model (whose forward, called through peft's, takes the same arguments)."""
    owner = getattr(forward, "__self__", forward)
    model = getattr(owner, "module", owner)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def logits_kwargs(forward: Callable, keep: int, width: int, device) -> dict:
    """`logits_to_keep` for models whose forward takes it (the LM head then runs only on the last
    `keep` of `width` positions), else nothing (the caller slices the full logits).

    Given as the positions' indices, not the count: transformers then gathers those hidden states
    into a contiguous tensor, where a count slices a strided view of them, and a matrix product on
    a strided input takes a path whose rounding depends on the weight's address in memory (seen
    on the CPU: two copies of the same LM head, one a view into DeepSpeed's flat buffer, differed
    by 4e-7 in a log-prob). With the gather the same weights give the same logits wherever they
    live: async mode's generator copy samples exactly as the training module would."""
    if not _takes_logits_to_keep(type(model_behind(forward))):
        return {}
    return {"logits_to_keep": torch.arange(width - keep, width, device=device)}
