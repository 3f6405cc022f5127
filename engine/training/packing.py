"""No compute on padding: trim all-padding columns, and form micro-batches by token budget.

A rollout batch is laid out (B, P + R): prompts left-padded to the longest prompt P,
responses right-padded to the longest response R. A micro-batch only needs the columns
some row of it uses, so `trim_padding` cuts the shared padding on both sides, and
`token_budget_groups` puts rows of similar length together so little padding remains.
Because the update normalises the loss by the token count of the whole mini-batch, how
rows are grouped into micro-batches does not change the gradient.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.padding import SEQUENCE_KEYS
from hflow.engine.training.lockstep import agreed
from hflow.engine.training.logprobs import prompt_groups, shared_prefix_of



def real_response_lengths(batch: Batch) -> torch.Tensor:
    """(B,) tokens in each response: sampled and, in a multi-turn episode, the environment's
    (`response_mask` counts only the trained ones)."""
    mask = batch[col.ATTENTION_MASK]
    return mask[:, mask.shape[1] - batch[col.RESPONSE_MASK].shape[1]:].sum(-1)


def trim_padding(batch: Batch) -> Batch:
    """The batch without columns that are padding in every row.

    Tensors of shape (B, P + R) lose leading prompt padding and trailing response padding;
    tensors of shape (B, R) (per response token) lose the trailing response padding.
    """
    mask = batch[col.ATTENTION_MASK]
    width_r = batch[col.RESPONSE_MASK].shape[1]
    width_p = mask.shape[1] - width_r
    # The attention mask, not response_mask: a multi-turn response's environment tokens are
    # real tokens that are not trained on (`engine/rollout/episodes.py`).
    used_r = max(1, int(mask[:, width_p:].sum(-1).max()))
    prompt_mask = mask[:, :width_p]
    lead = int((prompt_mask.cumsum(-1) == 0).sum(-1).min()) if width_p else 0
    tensors = {}
    for key, t in batch.tensors.items():
        if key in SEQUENCE_KEYS:
            tensors[key] = t[:, lead:width_p + used_r]
        elif t.dim() >= 2 and t.shape[1] == width_r:
            tensors[key] = t[:, :used_r]
        else:
            tensors[key] = t
    return Batch(tensors, batch.columns, dict(batch.meta))


def token_budget_groups(lengths: torch.Tensor, max_tokens: int, min_groups: int = 1, with_cost: bool = False,
                        packed: bool = False):
    """Row indices in micro-batches that waste the least compute on padding.

    A micro-batch is computed at (rows x its longest row) tokens (rows are scored left-aligned,
    see `logprobs.response_log_probs`), or, `packed` (`packed.py`), at its rows' own tokens; each
    one costs a fixed overhead, counted as one more row of the mini-batch's longest: splitting
    pays only where it saves more padding than that. Rows are taken longest first and the order
    is cut into consecutive groups by dynamic programming (exact for that order). No group
    exceeds `max_tokens`, except a single row longer than it. At least `min_groups` groups are
    made (ranks of a data-parallel group must run the same number of micro-batches), splitting
    the largest. `with_cost` also returns the cut's cost in tokens (overheads included, before
    any split for `min_groups`).
    """
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    widths = lengths[order].double().numpy()  # a group [j, i) is as wide as its row j
    overhead = max(1.0, float(widths.max())) if len(order) else 0.0
    tokens = _summed(widths) if packed else lambda i: np.arange(i, 0, -1) * widths[:i]
    cuts, cost = _cheapest_cut(len(order), tokens, overhead, max_tokens)
    groups = _split_to([[order[k] for k in group] for group in cuts], min_groups)
    return (groups, cost) if with_cost else groups


def prompt_group_cut(prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, groups: torch.Tensor,
                     max_tokens: int, min_groups: int = 1, with_cost: bool = False, packed: bool = False,
                     prefix: int = 0):
    """Like `token_budget_groups`, for rows scored with their prompt run once per prompt group
    (`logprobs.response_log_probs`): a prompt group's rows stay together and consecutive, and a
    micro-batch costs (its prompt groups x its longest prompt) + (its rows x its longest
    response) tokens, or, `packed`, its prompts' and rows' own tokens after the `prefix` every
    prompt begins with, plus one longest row: the prefix runs once for all the micro-batches
    (`logprobs.trained_prefix`), so a cut into more costs no more of it. Prompt groups are taken
    longest response first and cut by dynamic programming, as there."""
    counts = torch.unique_consecutive(groups, return_counts=True)[1].tolist()
    unit_rows = [part.tolist() for part in torch.arange(len(groups)).split(counts)]
    response = np.array([float(response_lengths[rows].max()) for rows in unit_rows])
    order = np.argsort(-response, kind="stable").tolist()
    prompt = np.array([float(prompt_lengths[unit_rows[u][0]]) for u in order])
    response = response[order]
    rows_before = np.concatenate([[0.0], np.cumsum([len(unit_rows[u]) for u in order])])

    def padded(i: int) -> np.ndarray:
        widest_prompt = np.maximum.accumulate(prompt[i - 1::-1])[::-1]  # over units [j, i)
        return np.arange(i, 0, -1) * widest_prompt + (rows_before[i] - rows_before[:i]) * response[:i]

    overhead = max(1.0, float(prompt.max() + response.max())) if order else 0.0
    tokens = padded
    if packed:
        tokens = _summed(prompt - prefix + np.array([float(response_lengths[unit_rows[u]].sum()) for u in order]))
    cuts, cost = _cheapest_cut(len(order), tokens, overhead, max_tokens)
    cost += prefix if packed else 0.0  # once, whatever the cut
    cuts = _split_to([[order[k] for k in group] for group in cuts], min_groups)
    rows = [[row for u in chosen for row in unit_rows[u]] for chosen in cuts]
    # Fewer prompt groups than `min_groups`: split within a group (each part runs its prompt).
    rows = _split_to(rows, min_groups)
    return (rows, cost) if with_cost else rows


def _summed(tokens: np.ndarray):
    """`_cheapest_cut`'s `padded` for items that compute only their own `tokens` (packed)."""
    ends = np.concatenate([[0.0], np.cumsum(tokens)])
    return lambda i: ends[i] - ends[:i]


def _cheapest_cut(count: int, padded, overhead: float, max_tokens: int) -> tuple[list[list[int]], float]:
    """The cut of items [0, count) into consecutive groups that costs least, and its cost.

    `padded(i)` gives the padded tokens of the groups [j, i) for every j < i at once; a group
    costs that plus `overhead`, and only a single item may exceed `max_tokens`. Dynamic
    programming on numpy: a mini-batch makes a few hundred small vector operations.
    """
    best = np.zeros(count + 1)
    back = [0] * (count + 1)  # back[i]: where the last group of the best cut of [0, i) starts
    for i in range(1, count + 1):
        tokens = padded(i)
        cost = best[:i] + tokens + overhead
        cost[:i - 1][tokens[:i - 1] > max_tokens] = np.inf  # the group [i - 1, i) is one item
        back[i] = int(np.argmin(cost))
        best[i] = cost[back[i]]
    groups: list[list[int]] = []
    i = count
    while i > 0:
        groups.insert(0, list(range(back[i], i)))
        i = back[i]
    return groups, float(best[count])


def _split_to(groups: list[list[int]], min_groups: int) -> list[list[int]]:
    """At least `min_groups` groups (as many as there are items at most), halving the largest."""
    while len(groups) < min(min_groups, sum(map(len, groups))):
        biggest = max(range(len(groups)), key=lambda g: len(groups[g]))
        group = groups.pop(biggest)
        half = len(group) // 2
        groups[biggest:biggest] = [group[:half], group[half:]]
    return groups


def micro_batches(mini: Batch, micro_batch_size: int, micro_batch_tokens: int | None, world_size: int,
                  device, share_prompts: bool = False, zero3: bool = False, packed: bool = False) -> list[Batch]:
    """A mini-batch's micro-batches: rows grouped by length within the token budget (default
    `micro_batch_size` x the longest sequence), shared padding cut. With `share_prompts` (rows
    scored by `logprobs.response_log_probs`, where `logprobs.can_share_prompts`), the n samples of
    a prompt stay together so that their prompt runs once. `packed` (`logprobs.scores_packed`):
    a micro-batch costs, and holds within the budget, its rows' own tokens, not its padded size.
    Every rank of a data-parallel group gets the same number of micro-batches, since ZeRO reduces
    gradients collectively.

    `zero3` (a ZeRO-3 shard is trained, `lockstep.py`): the ranks also agree whether to share
    prompts (only if every rank's cheaper cut does), and each micro-batch is marked so that
    `response_log_probs` follows that choice, not its own rows: every rank runs the same forwards."""
    lengths = mini[col.ATTENTION_MASK].sum(-1)
    budget = micro_batch_tokens or micro_batch_size * int(lengths.max())
    cut = functools.partial(token_budget_groups, lengths, budget, packed=packed)
    rows, cost = cut(with_cost=True)
    groups = prompt_groups(mini) if share_prompts else None
    # Packed, prompts that begin alike run that prefix once (`packed.shared_prefix`, held across them).
    head = shared_prefix_of(mini, groups) if groups is not None and packed else 0
    if groups is not None and (int(groups[-1]) + 1 < len(groups) or head):
        # Sharing prompts keeps a prompt's rows together, which can cost more padding than it
        # saves (short prompts, uneven responses): take whichever cut computes fewer tokens.
        responses = real_response_lengths(mini)
        shared = functools.partial(prompt_group_cut, lengths - responses, responses, groups, budget, packed=packed,
                                   prefix=head)
        shared_rows, shared_cost = shared(with_cost=True)
        cheaper = shared_cost < cost
    else:
        cheaper = False
    lockstep = zero3 and world_size > 1
    if lockstep:
        cheaper = bool(agreed(cheaper, "min", device))
    if cheaper:
        cut, rows = shared, shared_rows
    if world_size > 1:
        count = agreed(len(rows), "max", device)
        if count > len(rows):
            rows = cut(min_groups=count)
        if lockstep and len(rows) < count:
            raise RuntimeError(f"ZeRO-3 ranks must run the same micro-batches, but this rank has {len(mini)} "
                               f"rows for {count}: data-parallel ranks must hold equal row counts")
    micros = [trim_padding(mini.index(r)) for r in rows]
    for micro in micros:
        micro.meta["share_prompts"] = cut.func is prompt_group_cut
        micro.meta["lockstep"] = lockstep
    return micros


def global_token_count(mask: torch.Tensor, world_size: int, device) -> float:
    """Response tokens of a mini-batch summed over the data-parallel group (at least 1): the
    denominator that makes the loss a token-mean over the whole mini-batch on every rank."""
    tokens = mask.sum().float().to(device)
    if world_size > 1:
        torch.distributed.all_reduce(tokens)
    return float(tokens.clamp(min=1))
