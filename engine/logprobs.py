"""Per-token log-probs (and entropy) of the response tokens under a causal LM.

Used by the actor (old and new policy), the reference, and the update. Logits are
divided by the sampling temperature so that training scores tokens under the same
distribution they were sampled from.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch
import torch.nn.functional as F

from hflow.engine.batch import Batch


@functools.cache
def _takes_logits_to_keep(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def _logits_kwargs(forward: Callable, width: int) -> dict:
    """`logits_to_keep` for models that take it: the LM head then runs only on the response
    positions, not on the prompt's (with a large vocabulary, most of the logits' memory)."""
    owner = getattr(forward, "__self__", forward)  # a bound method (DeepSpeed's) or the model
    model = getattr(owner, "module", owner)
    return {"logits_to_keep": width + 1} if _takes_logits_to_keep(type(model)) else {}


def response_log_probs(forward: Callable, batch: Batch, temperature: float,
                       with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs of `responses` given everything before them; entropy (B, R) if asked."""
    responses = batch["responses"]
    width = responses.shape[1]
    out = forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  position_ids=batch["position_ids"], use_cache=False, **_logits_kwargs(forward, width))
    # Logits at position t predict token t + 1: the response's logits start one before it.
    logits = out.logits[:, -width - 1:-1].float() / temperature
    log_softmax = F.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, responses[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


@torch.no_grad()
def batched_log_probs(forward: Callable, batch: Batch, temperature: float, micro_batch_size: int,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`response_log_probs` over micro-batches, without gradients."""
    parts = [response_log_probs(forward, micro, temperature, with_entropy)
             for micro in batch.split(micro_batch_size)]
    log_probs = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts]) if with_entropy else None
    return log_probs, entropy


def ptx_loss(forward: Callable, batch: Batch, rows: int) -> torch.Tensor:
    """Pretraining (PTX) loss: next-token NLL of `ptx_input_ids` under `ptx_attention_mask` (B, L),
    right-padded. Each row's token-mean NLL, summed over the rows and divided by `rows` (the
    mini-batch's rows on this rank), so that micro-batch shares add up to the mini-batch mean."""
    from hflow.engine.rollout_output import positions

    ids, mask = batch["ptx_input_ids"], batch["ptx_attention_mask"]
    out = forward(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
    log_probs = F.log_softmax(out.logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    target = mask[:, 1:].float()
    per_row = -(log_probs * target).sum(-1) / target.sum(-1).clamp(min=1)
    return per_row.sum() / rows
