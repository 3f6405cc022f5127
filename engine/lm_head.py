"""Asking a causal LM's forward for only the logits that are used.

The LM head's output is (rows, positions, vocab): with a large vocabulary it is most of a
forward's memory (Qwen2.5's 151,936 tokens: 32 prompts x 512 positions in bfloat16 are about
5 GB). transformers' causal LMs take `logits_to_keep`, which runs the head on the last
positions only; generation's prefill needs one, scoring the responses only theirs. Shared by
the rollout (`rollout/generation.py`) and training (`training/logprobs.py`) sides, so that
neither imports the other for it.
"""

from __future__ import annotations

import contextlib
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


# Causal LMs whose forward runs the head as `lm_head(hidden_states[:, kept, :])` and returns its
# output as the logits untouched (transformers' Llama, Qwen2/3 and Mistral): for these the head
# can be run on a list of (row, position) pairs instead of whole columns (`head_at`).
HEAD_AT_MODELS = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"}


def can_head_at(forward: Callable) -> bool:
    model = model_behind(forward)
    return type(model).__name__ in HEAD_AT_MODELS and model.get_output_embeddings() is not None


@contextlib.contextmanager
def head_at(forward: Callable, rows: torch.Tensor, columns: torch.Tensor):
    """Within the block, the model's LM head runs only on the hidden states at (rows[i],
    columns[i]): a forward's `logits` are then (K, V), row i for pair i. Where the responses of a
    batch end at different lengths, or some tokens are not scored (a tool's output in a
    multi-turn episode), whole columns would run the head on positions nobody reads; with a
    49k-151k-token vocabulary the head is a fifth to a third of a small model's FLOPs, and its
    (rows, positions, vocab) output the largest tensor of the pass. Only for `can_head_at` models."""
    head = model_behind(forward).get_output_embeddings()

    def gather(module, args):
        return (args[0][rows, columns],) + tuple(args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield
    finally:
        handle.remove()
