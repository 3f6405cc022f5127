"""Per-token log-probs (and entropy) of the response tokens under a causal LM.

Used by the actor (old and new policy), the reference, and the update. Logits are
divided by the sampling temperature so that training scores tokens under the same
distribution they were sampled from. The LM head runs only on the positions scored
(`lm_head.logits_kwargs`), and the log-probs come from its logits a chunk of tokens at a time
(`token_logprobs.token_log_probs`): no float32 copy of all the logits.

Two ways to score, the same numbers (tested against each row scored alone):
  shared prompt  a prompt's n samples run its prompt once; the KV cache is repeated to them
  whole rows     each row shifted to column 0 and run without an attention mask
"""

from __future__ import annotations

from typing import Callable

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.lm_head import logits_kwargs, model_behind
from hflow.engine.rollout.assembly import positions
from hflow.engine.training.lockstep import agreed, several_ranks
from hflow.engine.training.token_logprobs import token_log_probs


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
    """(B, R) float32 log-probs of `responses` given everything before them; entropy (B, R) if asked.

    Rows that share their prompt with the row before (a prompt's n samples) are scored with
    the prompt run once (`_shared_prompt_scores`), unless `batch.meta["share_prompts"]` is false
    (set by `packing.micro_batches`, which chose a cut for whole rows); otherwise every row is
    scored whole (`_left_aligned_scores`). See `shares_prompts` for `batch.meta["lockstep"]`.
    """
    groups = prompt_groups(batch)
    if shares_prompts(forward, batch, groups):
        return _shared_prompt_scores(forward, batch, groups, temperature, with_entropy)
    return _left_aligned_scores(forward, batch, temperature, with_entropy)


def shares_prompts(forward: Callable, batch: Batch, groups: torch.Tensor | None = None) -> bool:
    """Whether `response_log_probs` runs `batch`'s prompts once (two forwards) or its rows whole (one).

    Normally: where some rows repeat a prompt, unless `batch.meta["share_prompts"]` is false. With
    `batch.meta["lockstep"]` (ZeRO-3 ranks, `lockstep.py`) `share_prompts` is the choice itself,
    agreed by every rank, whatever this batch's rows: a batch without repeated prompts is then
    scored in two forwards too (each row its own group: the same numbers).
    """
    share = batch.meta.get("share_prompts", True) and _can_share(forward)
    if batch.meta.get("lockstep") or not share:
        return bool(share)
    groups = prompt_groups(batch) if groups is None else groups
    return int(groups[-1]) + 1 < len(groups)


def _can_share(forward: Callable) -> bool:
    """The prompt's cache must carry gradients into the response pass: not with activation
    checkpointing (transformers turns the cache off there while training)."""
    model = model_behind(forward)
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return not (torch.is_grad_enabled() and getattr(model, name, False))


def _shared_prompt_scores(forward: Callable, batch: Batch, groups: torch.Tensor, temperature: float,
                          with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs (and entropy), each distinct prompt run once.

    The prompts (left-padded, as in the rollout) go through the model once per group with the
    KV cache on; the cache is repeated to the group's rows (an indexing step, so gradients flow
    back into the prompt pass), and the responses run on top of it. The last prompt position's
    logits predict every row's first response token; response position t's, token t + 1.
    """
    mask, responses = batch[col.ATTENTION_MASK], batch[col.RESPONSES]
    rows, width_r = responses.shape
    width_p = mask.shape[1] - width_r
    first_rows = torch.cat([groups.new_zeros(1), (groups[1:] != groups[:-1]).nonzero().squeeze(-1) + 1])
    prompt_ids, prompt_mask = batch[col.INPUT_IDS][first_rows, :width_p], mask[first_rows, :width_p]
    prefix = forward(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                     use_cache=True, **logits_kwargs(forward, 1, width_p, prompt_ids.device))
    cache = prefix.past_key_values
    groups = groups.to(prompt_ids.device)
    cache.batch_select_indices(groups)
    last = prefix.logits.shape[1] - 1
    first = token_log_probs(prefix.logits, (groups, torch.full_like(groups, last)), responses[:, 0],
                            temperature, with_entropy)
    if width_r == 1 and not batch.meta.get("lockstep"):
        return tuple(a[:, None] if a is not None else None for a in first)
    # The responses but their last column, whose output predicts nothing (ZeRO-3 ranks in lockstep
    # run this forward even for one column, as every rank must).
    ids = responses[:, :-1] if width_r > 1 else responses
    start = mask[:, :width_p].sum(-1, keepdim=True)
    out = forward(input_ids=ids, attention_mask=mask[:, :width_p + ids.shape[1]],
                  position_ids=start + torch.arange(ids.shape[1], device=mask.device)[None],
                  past_key_values=cache, use_cache=True)
    row = torch.arange(rows, device=mask.device)[:, None].expand(-1, width_r - 1)
    column = torch.arange(width_r - 1, device=mask.device)[None].expand(rows, -1)
    rest = token_log_probs(out.logits, (row, column), responses[:, 1:], temperature, with_entropy)
    return tuple(torch.cat([a[:, None], b], dim=1) if a is not None else None for a, b in zip(first, rest))


def _left_aligned_scores(forward: Callable, batch: Batch, temperature: float,
                         with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs (and entropy), every row scored whole.

    The rollout layout (prompts left-padded, responses right-padded) is shifted so that every
    row starts at column 0: a causal model then needs no attention mask (padding only follows
    a row's tokens, which never attend forward), runs the fused causal attention, and computes
    max(prompt + response) columns instead of max(prompt) + max(response).
    """
    responses, mask = batch[col.RESPONSES], batch[col.ATTENTION_MASK]
    width_r = responses.shape[1]
    width_p = mask.shape[1] - width_r
    prompt_lengths = mask[:, :width_p].sum(-1)
    # Every row's tokens but the longest row's last, whose output predicts nothing.
    columns = max(1, int(mask.sum(-1).max()) - 1)
    source = (width_p - prompt_lengths)[:, None] + torch.arange(columns, device=mask.device)[None]
    input_ids = batch[col.INPUT_IDS].gather(1, source.clamp(max=mask.shape[1] - 1))
    # Logits at column t predict token t + 1: row i's response logits start at column p_i - 1.
    first = min(int(prompt_lengths.min()) - 1, columns - 1)
    out = forward(input_ids=input_ids, use_cache=False,
                  **logits_kwargs(forward, columns - first, columns, mask.device))
    logits = out.logits
    kept = columns - first  # the logits' last `kept` columns are columns first, first + 1, ...
    at = (prompt_lengths - 1 - first)[:, None] + torch.arange(width_r, device=mask.device)[None]
    at = at.clamp(max=kept - 1) + (logits.shape[1] - kept)  # past a row's end: masked out by response_mask
    row = torch.arange(len(at), device=mask.device)[:, None].expand_as(at)
    return token_log_probs(logits, (row, at), responses, temperature, with_entropy)


@torch.no_grad()
def batched_log_probs(forward: Callable, batch: Batch, temperature: float, micro_batch_size: int,
                      with_entropy: bool = False, zero3: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`response_log_probs` over micro-batches of `micro_batch_size` rows, without gradients.

    `zero3` (the model is a ZeRO-3 shard): with several ranks every rank runs the same forwards
    (`lockstep.py`): they agree whether to share prompts (only if all would) and on the number of
    micro-batches (the most any has), a rank with fewer running one-token dummies.
    """
    micros = batch.split(micro_batch_size)
    dummies = 0
    if zero3 and several_ranks():
        device = batch[col.RESPONSES].device
        share = agreed(len(batch) > 0 and shares_prompts(forward, batch), "min", device)
        dummies = agreed(len(micros), "max", device) - len(micros)
        micros = micros + [_dummy(batch)] * dummies
        for micro in micros:
            micro.meta.update(share_prompts=bool(share), lockstep=True)
    parts = [response_log_probs(forward, micro, temperature, with_entropy) for micro in micros]
    parts = parts[:len(parts) - dummies]
    if not parts:
        empty = batch[col.RESPONSES].new_zeros(batch[col.RESPONSES].shape, dtype=torch.float32)
        return empty, empty.clone() if with_entropy else None
    log_probs = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts]) if with_entropy else None
    return log_probs, entropy


def _dummy(like: Batch) -> Batch:
    """One row of one prompt token and one response token (token id 0): a forward that only
    keeps a rank in step with the others."""
    ids = like[col.RESPONSES].new_zeros(1, 2)
    mask = torch.ones_like(ids, dtype=like[col.ATTENTION_MASK].dtype)
    return Batch({col.INPUT_IDS: ids, col.ATTENTION_MASK: mask, col.RESPONSES: ids[:, 1:],
                  col.RESPONSE_MASK: mask[:, 1:]})


def ptx_loss(forward: Callable, batch: Batch, rows: int) -> torch.Tensor:
    """Pretraining (PTX) loss: next-token NLL of `ptx_input_ids` under `ptx_attention_mask` (B, L),
    right-padded. Each row's token-mean NLL, summed over the rows and divided by `rows` (the
    mini-batch's rows on this rank), so that micro-batch shares add up to the mini-batch mean."""
    ids, mask = batch[col.PTX_INPUT_IDS], batch[col.PTX_ATTENTION_MASK]
    out = forward(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
    row = torch.arange(len(ids), device=ids.device)[:, None].expand(-1, ids.shape[1] - 1)
    column = torch.arange(ids.shape[1] - 1, device=ids.device)[None].expand(len(ids), -1)
    log_probs, _ = token_log_probs(out.logits, (row, column), ids[:, 1:], 1.0)
    target = mask[:, 1:].float()
    per_row = -(log_probs * target).sum(-1) / target.sum(-1).clamp(min=1)
    return per_row.sum() / rows
