"""Per-token log-probs (and entropy) of the response tokens under a causal LM.

Used by the actor (old and new policy), the reference, and the update. Logits are
divided by the sampling temperature so that training scores tokens under the same
distribution they were sampled from. The LM head runs only on the positions scored
(`lm_head.head_at`; for other architectures on the columns that hold them, `logits_kwargs`), and
the log-probs come from its logits a chunk of tokens at a time (`token_logprobs.token_log_probs`):
no float32 copy of all the logits. Positions not scored are zero on the `head_at` path and
unspecified otherwise: every caller masks them with `response_mask`.

Two ways to score, the same numbers (tested against each row scored alone), both with their rows
in length buckets (`length_buckets`: no forward wider than its rows need, where that pays):
  shared prompt  a prompt's n samples run its prompt once; the KV cache is repeated to them
  whole rows     each row shifted to column 0 and run without an attention mask
"""

from __future__ import annotations

from typing import Callable

import torch
from transformers import DynamicCache

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.lm_head import can_head_at, head_at, logits_kwargs, model_behind
from hflow.engine.padding import positions
from hflow.engine.training.lockstep import agreed, several_ranks
from hflow.engine.training.held_prefix import HeldPrefix
from hflow.engine.training.packed import can_pack, held_prefix, packed_logits, packed_prompt_logits, shared_prefix
from hflow.engine.training.token_logprobs import token_log_probs

# A scoring call cut into this many micro-batches or more runs its prompts' common prefix once and
# hands its keys and values to the others (`_held_prefix`; an update's, `trained_prefix`).
HELD_FROM_MICRO_BATCHES = 2


def prompt_groups(batch: Batch) -> torch.Tensor:
    """(B,) group index of each row: consecutive rows with the same prompt share one (the n
    samples of a prompt, as rollouts lay them out)."""
    mask = batch[col.ATTENTION_MASK]
    width_p = mask.shape[1] - batch[col.RESPONSE_MASK].shape[1]
    prompts = batch[col.INPUT_IDS][:, :width_p] * mask[:, :width_p]
    lengths = mask[:, :width_p].sum(-1)
    same = (prompts[1:] == prompts[:-1]).all(-1) & (lengths[1:] == lengths[:-1])
    return torch.cat([same.new_zeros(1, dtype=torch.long), (~same).long().cumsum(0)])


def response_log_probs(forward: Callable, batch: Batch, temperature: float, with_entropy: bool = False,
                       held: HeldPrefix | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) float32 log-probs of `responses` given everything before them; entropy (B, R) if asked.

    Rows that share their prompt with the row before (a prompt's n samples) are scored with
    the prompt run once (`_shared_prompt_scores`; packed, so are prompts that begin alike: their
    common prefix runs once, `packed.shared_prefix`), unless `batch.meta["share_prompts"]` is false
    (set by `packing.micro_batches`, which chose a cut for whole rows); otherwise every row is
    scored whole (`_left_aligned_scores`). See `shares_prompts` for `batch.meta["lockstep"]`. With a
    `held` prefix (packed: `batched_log_probs`, `trained_prefix`) the prompts share it."""
    groups = prompt_groups(batch)
    if held is not None or shares_prompts(forward, batch, groups):
        return _shared_prompt_scores(forward, batch, groups, temperature, with_entropy, held)
    return _left_aligned_scores(forward, batch, temperature, with_entropy)


def shares_prompts(forward: Callable, batch: Batch, groups: torch.Tensor | None = None) -> bool:
    """Whether `response_log_probs` runs `batch`'s prompts once or its rows whole.

    Normally: where some rows repeat a prompt, or packed rows' prompts share a prefix worth running
    once, unless `batch.meta["share_prompts"]` is false. With
    `batch.meta["lockstep"]` (ZeRO-3 ranks, `lockstep.py`) `share_prompts` is the choice itself,
    agreed by every rank, whatever this batch's rows: a batch without repeated prompts is then
    scored in two forwards too (each row its own group: the same numbers).
    """
    share = batch.meta.get("share_prompts", True) and can_share_prompts(forward, bool(batch.meta.get("lockstep")))
    if batch.meta.get("lockstep") or not share:
        return bool(share)
    groups = prompt_groups(batch) if groups is None else groups
    return int(groups[-1]) + 1 < len(groups) or (_packs(forward, batch) and shared_prefix_of(batch, groups) > 0)


def group_prompts(batch: Batch, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt_ids, prompt_mask) (G, P): each prompt group's prompt, left-padded, from its first row."""
    mask = batch[col.ATTENTION_MASK]
    width_p = mask.shape[1] - batch[col.RESPONSES].shape[1]
    first_rows = torch.cat([groups.new_zeros(1), (groups[1:] != groups[:-1]).nonzero().squeeze(-1) + 1])
    return batch[col.INPUT_IDS][first_rows, :width_p], mask[first_rows, :width_p]


def shared_prefix_of(batch: Batch, groups: torch.Tensor) -> int:
    """The tokens every prompt of `batch` begins with that a packed pass runs once (`packed.shared_prefix`)."""
    return shared_prefix(*group_prompts(batch, groups))


def scores_packed(forward: Callable, lockstep: bool = False) -> bool:
    """Whether `response_log_probs` runs rows packed (`packed.py`): on a model that packs, unless
    ZeRO-3 ranks in lockstep (`batch.meta["lockstep"]`) must run the same forwards whatever their rows."""
    return not lockstep and can_pack(forward)


def _packs(forward: Callable, batch: Batch) -> bool:
    return scores_packed(forward, bool(batch.meta.get("lockstep")))


def can_share_prompts(forward: Callable, lockstep: bool = False) -> bool:
    """Whether `forward` can run a prompt once for its rows. Packed (`scores_packed`), a prompt runs
    in the same forward as its rows; otherwise its KV cache must carry gradients into the response
    pass: not with activation checkpointing (transformers turns the cache off there while training)."""
    if scores_packed(forward, lockstep):
        return True
    model = model_behind(forward)
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return not (torch.is_grad_enabled() and getattr(model, name, False))


def _shared_prompt_scores(forward: Callable, batch: Batch, groups: torch.Tensor, temperature: float,
                          with_entropy: bool,
                          held: HeldPrefix | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs (and entropy), each distinct prompt run once; zero where not scored.

    A model that packs runs the prompts and the responses as one packed sequence
    (`packed.packed_prompt_logits`). Otherwise the prompts (left-padded, as in the rollout) go
    through the model once per group with the KV cache on; the cache is repeated to the group's
    rows (an indexing step, so gradients flow back into the prompt pass), and the responses run on
    top of it, in buckets of rows of similar length (`length_buckets`), each only as wide as its
    longest row needs. The last prompt position's logits predict every row's first response
    token; response position t's, token t + 1. The LM head runs only where a token is scored
    (`lm_head.head_at`).
    """
    mask, responses = batch[col.ATTENTION_MASK], batch[col.RESPONSES]
    rows, width_r = responses.shape
    width_p = mask.shape[1] - width_r
    prompt_ids, prompt_mask = group_prompts(batch, groups)
    groups = groups.to(prompt_ids.device)
    # Response column t's output scores token t + 1: a row needs its columns up to its last scored one.
    scored = batch[col.RESPONSE_MASK][:, 1:].bool()
    if _packs(forward, batch):
        return _packed_scores(forward, prompt_ids, prompt_mask, groups, responses, scored, temperature, with_entropy,
                              held)
    prefix = forward(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                     use_cache=True, **logits_kwargs(forward, 1, width_p, prompt_ids.device))
    cache, lockstep = prefix.past_key_values, bool(batch.meta.get("lockstep"))
    last = prefix.logits.shape[1] - 1
    first = token_log_probs(prefix.logits, (groups, torch.full_like(groups, last)), responses[:, 0],
                            temperature, with_entropy)
    if width_r == 1 and not lockstep:
        return tuple(a[:, None] if a is not None else None for a in first)
    start = mask[:, :width_p].sum(-1, keepdim=True)
    if lockstep:
        # ZeRO-3 ranks in lockstep run the same forwards: one of every row, the responses but their
        # last column (one column when there is only one), as every rank must.
        buckets = [(torch.arange(rows, device=mask.device), max(1, width_r - 1))]
    else:
        buckets = length_buckets(last_scored(scored) + 1, mask.device)
    at_rows, at_columns, parts = [], [], []
    for index, width in buckets:
        ids = responses[index, :width]
        local_row, column = scored[index, :width].nonzero(as_tuple=True)
        out = _scored_forward(forward, (local_row, column), input_ids=ids,
                              attention_mask=mask[index, :width_p + width],
                              position_ids=start[index] + torch.arange(width, device=mask.device)[None],
                              past_key_values=_repeated_cache(cache, groups[index]), use_cache=True)
        where = () if out.logits.dim() == 2 else (local_row, column)
        parts.append(token_log_probs(out.logits, where, responses[index[local_row], column + 1], temperature,
                                     with_entropy))
        at_rows.append(index[local_row])
        at_columns.append(column + 1)
    return _placed(parts, at_rows, at_columns, (rows, width_r), mask.device, with_entropy, first)


def _packed_scores(forward: Callable, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, groups: torch.Tensor,
                   responses: torch.Tensor, scored: torch.Tensor, temperature: float,
                   with_entropy: bool, held: HeldPrefix | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_shared_prompt_scores` as one packed forward (`packed.packed_prompt_logits`), its logits
    scored in one pass (each prompt's last, scored by its every row, then the scored positions'):
    two slices of them would each take back a zeroed gradient of all of them."""
    rows, width_r = responses.shape
    row, column = scored.nonzero(as_tuple=True)
    widths = last_scored(scored) + 1 if width_r > 1 else torch.zeros_like(groups)
    logits = packed_prompt_logits(forward, prompt_ids, prompt_mask, groups, responses, widths, (row, column), held)
    scored_rows = torch.cat([groups, len(prompt_ids) + torch.arange(len(row), device=groups.device)])
    both = token_log_probs(logits, (scored_rows,), torch.cat([responses[:, 0], responses[row, column + 1]]),
                           temperature, with_entropy)
    first, rest = zip(*(t.split([rows, len(row)]) if t is not None else (None, None) for t in both))
    parts = [rest] if len(row) else []
    return _placed(parts, [row], [column + 1], (rows, width_r), responses.device, with_entropy, first)


def last_scored(scored: torch.Tensor) -> torch.Tensor:
    """(B,) the column of each row's last True in (B, C) `scored`; -1 for a row with none."""
    last = scored.shape[1] - 1 - scored.flip(-1).int().argmax(-1)
    return torch.where(scored.any(-1), last, -1)


# What one more forward costs, in tokens of padding. A forward's matrix products run below peak
# on few rows: their time goes as (rows + M0), M0 the rows' worth of work lost per product. On
# the 2-core development CPU at SmolLM2's widths, (M, 576) x (576, 1536) ran at 61 GFLOP/s for
# M = 100, 83 at 240 and 97 at 480 (2026-11-26): M0 of about 70-100. On a GPU a forward is bound
# by kernel launches until it has thousands of tokens.
BUCKET_OVERHEAD_TOKENS = {"cpu": 96, "cuda": 2048}


def length_buckets(widths: torch.Tensor, device) -> list[tuple[torch.Tensor, int]]:
    """Rows of (B,) needed widths in buckets [(row indices, width)] whose forwards, each as wide
    as its widest row, cost the least: rows sorted by width, cut where a bucket's padding saved
    outweighs one more forward (`BUCKET_OVERHEAD_TOKENS`). Short responses of similar lengths stay
    one forward; long ones of mixed lengths split (on SmolLM2, 16 rows of 64-128 tokens: two
    forwards, 1.3x faster through forward and backward; `benchmarks/scoring_buckets.py`). Rows
    needing no column are left out. An optimal partition of the sorted rows into runs (dynamic
    programming, O(B^2)): sorting is optimal because a bucket costs its size times its widest row."""
    order = torch.argsort(widths, stable=True)
    sorted_widths = widths[order].tolist()
    skip = sum(1 for w in sorted_widths if w == 0)
    order, sorted_widths = order[skip:], sorted_widths[skip:]
    count = len(sorted_widths)
    if count == 0:
        return []
    overhead = BUCKET_OVERHEAD_TOKENS.get(torch.device(device).type, BUCKET_OVERHEAD_TOKENS["cuda"])
    best = [0.0] + [float("inf")] * count  # best[j]: least cost of the first j rows
    cut = [0] * (count + 1)
    for j in range(1, count + 1):
        for i in range(j):
            cost = best[i] + overhead + (j - i) * sorted_widths[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets, j = [], count
    while j > 0:
        i = cut[j]
        buckets.append((order[i:j].to(device), sorted_widths[j - 1]))
        j = i
    return buckets[::-1]


def _repeated_cache(cache, rows: torch.Tensor):
    """A new cache holding `cache`'s entries at `rows` (a prompt's KV repeated to its samples),
    by indexing, so gradients flow back into the prompt pass; `cache` itself is left as it is."""
    repeated = DynamicCache()
    for i, layer in enumerate(cache.layers):
        repeated.update(layer.keys[rows], layer.values[rows], i)
    return repeated


def _scored_forward(forward: Callable, at: tuple[torch.Tensor, torch.Tensor], **inputs):
    """`forward(**inputs)`, its LM head run only at the (row, position) pairs `at` where the model
    allows (logits (K, V)); otherwise on every position (logits (rows, positions, V))."""
    if not can_head_at(forward):
        return forward(**inputs)
    with head_at(forward, *at):
        return forward(**inputs)


def _placed(parts: list, at_rows: list, at_columns: list, shape: tuple[int, int], device, with_entropy: bool,
            first: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs and entropy (or None): the scored positions (`at_rows`, `at_columns`, one
    pair of index tensors per forward) from `parts` in order; column 0 from `first` when given
    (the prompts' last logits); zero elsewhere. A differentiable placement (`index_put`)."""
    placed = []
    for k in range(2):
        if k == 1 and not with_entropy:
            placed.append(None)
            continue
        grid = torch.zeros(shape, dtype=torch.float32, device=device)
        if first is not None:
            grid = torch.cat([first[k][:, None], grid[:, 1:]], dim=1)
        if parts:
            grid = grid.index_put((torch.cat(at_rows), torch.cat(at_columns)), torch.cat([p[k] for p in parts]))
        placed.append(grid)
    return tuple(placed)


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
    if can_head_at(forward):
        return _left_aligned_buckets(forward, batch, prompt_lengths, input_ids, temperature, with_entropy)
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


def _left_aligned_buckets(forward: Callable, batch: Batch, prompt_lengths: torch.Tensor, input_ids: torch.Tensor,
                          temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_left_aligned_scores` in length buckets (`length_buckets`: each forward only as wide as its
    longest row needs) with the LM head only where a token is scored; zero elsewhere."""
    responses, scored = batch[col.RESPONSES], batch[col.RESPONSE_MASK].bool()
    # A row needs its columns through the one that predicts its last scored token: p + t_last.
    last = last_scored(scored)
    needed = torch.where(last >= 0, prompt_lengths + last, 0)
    if can_pack(forward) and bool(scored.any()):
        row, t = scored.nonzero(as_tuple=True)
        logits = packed_logits(forward, input_ids, needed, torch.zeros_like(needed), (row, prompt_lengths[row] - 1 + t))
        part = token_log_probs(logits, (), responses[row, t], temperature, with_entropy)
        return _placed([part], [row], [t], tuple(responses.shape), responses.device, with_entropy)
    at_rows, at_columns, parts = [], [], []
    for index, columns in length_buckets(needed, responses.device):
        row, t = scored[index].nonzero(as_tuple=True)
        with head_at(forward, row, prompt_lengths[index][row] - 1 + t):
            logits = forward(input_ids=input_ids[index, :columns], use_cache=False).logits
        parts.append(token_log_probs(logits, (), responses[index[row], t], temperature, with_entropy))
        at_rows.append(index[row])
        at_columns.append(t)
    return _placed(parts, at_rows, at_columns, tuple(responses.shape), responses.device, with_entropy)


@torch.no_grad()
def batched_log_probs(forward: Callable, batch: Batch, temperature: float, micro_batch_size: int,
                      with_entropy: bool = False, zero3: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`response_log_probs` over micro-batches of `micro_batch_size` rows, without gradients.

    Packed, the prefix every prompt of `batch` begins with runs in the first micro-batch only; the
    others attend to its keys and values (`_held_prefix`). `zero3` (the model is a ZeRO-3 shard):
    with several ranks every rank runs the same forwards (`lockstep.py`): they agree whether to
    share prompts (only if all would) and on the number of micro-batches (the most any has), a rank
    with fewer running one-token dummies.
    """
    micros = batch.split(micro_batch_size)
    dummies, held = 0, None
    if zero3 and several_ranks():
        device = batch[col.RESPONSES].device
        share = agreed(len(batch) > 0 and shares_prompts(forward, batch), "min", device)
        dummies = agreed(len(micros), "max", device) - len(micros)
        micros = micros + [_dummy(batch)] * dummies
        for micro in micros:
            micro.meta.update(share_prompts=bool(share), lockstep=True)
    else:
        held = _held_prefix(forward, batch, len(micros))
    parts = [response_log_probs(forward, micro, temperature, with_entropy, held) for micro in micros]
    parts = parts[:len(parts) - dummies]
    if not parts:
        empty = batch[col.RESPONSES].new_zeros(batch[col.RESPONSES].shape, dtype=torch.float32)
        return empty, empty.clone() if with_entropy else None
    log_probs = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts]) if with_entropy else None
    return log_probs, entropy


def _held_prefix(forward: Callable, batch: Batch, micros: int) -> HeldPrefix | None:
    """The prefix every prompt of `batch` begins with (`packed.shared_prefix` over all its prompts),
    to run once for its `micros` packed micro-batches; None where there is one, where the rows are
    not packed or scored with their prompts shared, or where no prefix is worth it."""
    shared = batch.meta.get("share_prompts", True)
    if micros < HELD_FROM_MICRO_BATCHES or not len(batch) or not shared or not _packs(forward, batch):
        return None
    return held_prefix(*group_prompts(batch, prompt_groups(batch)))


def trained_prefix(forward: Callable, mini: Batch, micros: list[Batch]) -> HeldPrefix | None:
    """The prefix every prompt of an update's mini-batch `mini` begins with, to run once, forward and
    backward, for its packed `micros` (a `HeldPrefix` with gradients: each scored with it, in order,
    each with its backward); None for one micro-batch, unpacked or whole rows, or no prefix worth it."""
    if len(micros) < HELD_FROM_MICRO_BATCHES:
        return None
    if not all(_packs(forward, micro) and micro.meta.get("share_prompts", True) for micro in micros):
        return None
    return held_prefix(*group_prompts(mini, prompt_groups(mini)), uses=len(micros))


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
