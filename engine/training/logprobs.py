"""Per-token log-probs (and entropy) of the response tokens under a causal LM.

Used by the actor (old and new policy), the reference, and the update. Logits are
divided by the sampling temperature so that training scores tokens under the same
distribution they were sampled from.

Two ways to score, the same numbers (tested against each row scored alone):
  shared prompt  a prompt's n samples run its prompt once; the KV cache is repeated to them
  whole rows     each row shifted to column 0 and run without an attention mask
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch
import torch.nn.functional as F

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.rollout.assembly import positions


@functools.cache
def _takes_logits_to_keep(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def _logits_kwargs(forward: Callable, keep: int) -> dict:
    """`logits_to_keep` for models that take it: the LM head then runs only on the last `keep`
    positions, not on the prompts' (with a large vocabulary, most of the logits' memory)."""
    return {"logits_to_keep": keep} if _takes_logits_to_keep(type(_model(forward))) else {}


def prompt_groups(batch: Batch) -> torch.Tensor:
    """(B,) group index of each row: consecutive rows with the same prompt share one (the n
    samples of a prompt, as rollouts lay them out)."""
    mask = batch[col.ATTENTION_MASK]
    width_p = mask.shape[1] - batch[col.RESPONSE_MASK].shape[1]
    prompts = batch[col.INPUT_IDS][:, :width_p] * mask[:, :width_p]
    lengths = mask[:, :width_p].sum(-1)
    same = (prompts[1:] == prompts[:-1]).all(-1) & (lengths[1:] == lengths[:-1])
    return torch.cat([same.new_zeros(1, dtype=torch.long), (~same).long().cumsum(0)])


def response_log_probs(forward: Callable, batch: Batch, temperature: float,
                       with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs of `responses` given everything before them; entropy (B, R) if asked.

    Rows that share their prompt with the row before (a prompt's n samples) are scored with
    the prompt run once (`_shared_prompt_logits`), unless `batch.meta["share_prompts"]` is false
    (set by `packing.micro_batches`, which chose a cut for whole rows); otherwise every row is
    scored whole (`_left_aligned_logits`).
    """
    responses = batch[col.RESPONSES]
    groups = prompt_groups(batch)
    share = batch.meta.get("share_prompts", True)
    if share and int(groups[-1]) + 1 < len(groups) and _can_share(forward):
        logits = _shared_prompt_logits(forward, batch, groups)
    else:
        logits = _left_aligned_logits(forward, batch)
    log_softmax = F.log_softmax(logits.float() / temperature, dim=-1)
    log_probs = log_softmax.gather(-1, responses[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


def _model(forward: Callable):
    """The model behind `forward`: a bound method (DeepSpeed's) or the model; with LoRA, peft's
    base model (whose forward, called through peft's, takes the same arguments)."""
    owner = getattr(forward, "__self__", forward)
    model = getattr(owner, "module", owner)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _can_share(forward: Callable) -> bool:
    """The prompt's cache must carry gradients into the response pass: not with activation
    checkpointing (transformers turns the cache off there while training)."""
    model = _model(forward)
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return not (torch.is_grad_enabled() and getattr(model, name, False))


def _shared_prompt_logits(forward: Callable, batch: Batch, groups: torch.Tensor) -> torch.Tensor:
    """(B, R, vocab) logits predicting each response token, each distinct prompt run once.

    The prompts (left-padded, as in the rollout) go through the model once per group with the
    KV cache on; the cache is repeated to the group's rows (an indexing step, so gradients flow
    back into the prompt pass), and the responses run on top of it. The last prompt position's
    logits predict every row's first response token.
    """
    mask = batch[col.ATTENTION_MASK]
    width_r = batch[col.RESPONSES].shape[1]
    width_p = mask.shape[1] - width_r
    first_rows = torch.cat([groups.new_zeros(1), (groups[1:] != groups[:-1]).nonzero().squeeze(-1) + 1])
    prompt_ids, prompt_mask = batch[col.INPUT_IDS][first_rows, :width_p], mask[first_rows, :width_p]
    prefix = forward(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                     use_cache=True, **_logits_kwargs(forward, 1))
    cache = prefix.past_key_values
    cache.batch_select_indices(groups.to(prompt_ids.device))
    start = mask[:, :width_p].sum(-1, keepdim=True)
    out = forward(input_ids=batch[col.RESPONSES], attention_mask=mask,
                  position_ids=start + torch.arange(width_r, device=mask.device)[None],
                  past_key_values=cache, use_cache=True)
    first = prefix.logits[:, -1:][groups]
    return torch.cat([first, out.logits[:, :-1]], dim=1)


def _left_aligned_logits(forward: Callable, batch: Batch) -> torch.Tensor:
    """(B, R, vocab) logits predicting each response token, every row scored whole.

    The rollout layout (prompts left-padded, responses right-padded) is shifted so that every
    row starts at column 0: a causal model then needs no attention mask (padding only follows
    a row's tokens, which never attend forward), runs the fused causal attention, and computes
    max(prompt + response) columns instead of max(prompt) + max(response).
    """
    responses, mask = batch[col.RESPONSES], batch[col.ATTENTION_MASK]
    width_r = responses.shape[1]
    width_p = mask.shape[1] - width_r
    prompt_lengths = mask[:, :width_p].sum(-1)
    columns = int(mask.sum(-1).max())
    source = (width_p - prompt_lengths)[:, None] + torch.arange(columns, device=mask.device)[None]
    input_ids = batch[col.INPUT_IDS].gather(1, source.clamp(max=mask.shape[1] - 1))
    # Logits at column t predict token t + 1: row i's response logits start at column p_i - 1.
    first = int(prompt_lengths.min()) - 1
    out = forward(input_ids=input_ids, use_cache=False, **_logits_kwargs(forward, columns - first))
    logits = out.logits[:, -(columns - first):]
    at = (prompt_lengths - 1 - first)[:, None] + torch.arange(width_r, device=mask.device)[None]
    at = at.clamp(max=logits.shape[1] - 1)  # past a row's end: masked out by response_mask
    return logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1]))


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
    ids, mask = batch[col.PTX_INPUT_IDS], batch[col.PTX_ATTENTION_MASK]
    out = forward(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
    log_probs = F.log_softmax(out.logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    target = mask[:, 1:].float()
    per_row = -(log_probs * target).sum(-1) / target.sum(-1).clamp(min=1)
    return per_row.sum() / rows
