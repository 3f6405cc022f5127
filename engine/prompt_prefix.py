"""The tokens a batch's prompts all begin with, which a forward needs to run only once.

Under causal attention a position's hidden state depends only on the tokens up to it, so prompts
that begin with the same tokens (a chat template's header, a system prompt, a shared instruction)
have the same keys, values and hidden states there: generation's prefill (`rollout/prefill.py`)
and the packed scoring and training passes (`training/packed.py`) run that prefix once for all of
them. Every prompt keeps at least its last token of its own: the logits there are its own.
"""

from __future__ import annotations

import torch


def common_prefix(prompts: list[list[int]]) -> int:
    """The tokens every one of two or more prompts begins with, short of each prompt's last."""
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    length = 0
    while length < limit and all(p[length] == first[length] for p in prompts):
        length += 1
    return length


def common_prefix_of(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """`common_prefix` of left-padded prompts: ids and mask (G, P), each prompt's tokens its last
    mask.sum() columns."""
    if ids.shape[0] < 2:
        return 0
    lengths = mask.sum(-1)
    limit = int(lengths.min()) - 1
    if limit <= 0:
        return 0
    starts = ids.shape[1] - lengths  # (G,) each prompt's first column
    heads = ids.gather(1, starts[:, None] + torch.arange(limit, device=ids.device)[None])  # (G, limit)
    differs = (heads != heads[:1]).any(0)
    return int(differs.int().argmax()) if bool(differs.any()) else limit


def already_begun(prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """(begun, rank): each prompt's place in sorted order, and how many of its first tokens the
    prompt before it in that order begins with too (0 for the first): the tokens its forward can
    take from one that already ran them. Their lengths less these are the nodes of the prompts'
    trie, the fewest positions that run all of them (each distinct prefix once); `trie_size` gives
    that of any subset."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    begun, rank = [0] * len(prompts), [0] * len(prompts)
    for place, i in enumerate(order):
        rank[i] = place
    for before, i in zip(order, order[1:]):
        a, b = prompts[before], prompts[i]
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        begun[i] = n
    return begun, rank


def trie_size(lengths: list[int], begun: list[int], rank: list[int], members: list[bool]) -> int:
    """The nodes of the trie of the member prompts (`already_begun`'s begun and rank of all of them):
    two prompts share as many first tokens as the least `begun` between them in sorted order."""
    total, shared, seen = 0, None, False
    for i in sorted(range(len(rank)), key=rank.__getitem__):
        shared = begun[i] if shared is None else min(shared, begun[i])
        if members[i]:
            total += lengths[i] - (shared if seen else 0)
            seen, shared = True, None
    return total
