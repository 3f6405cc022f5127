"""A decode batch's prefill: every prompt's keys and values, and the logits after its last token.

Prompts of one step often begin alike: a chat template's header and a system prompt, the same
instruction before each question (SmolLM2's arithmetic prompts share their first 27 of about 44
tokens). Those tokens' keys and values are the same for every prompt (`prompt_prefix.py`), so
`prefill` runs their longest common prefix once, as a batch of one row, repeats its cache to every
prompt, and runs only each prompt's own rest after it (the idea of
prefix caching: Kwon et al. 2023, arXiv 2309.06180, Section 4.4; Zheng et al. 2023, arXiv
2312.07104). What the decoding step then reads is laid out as before, one row per prompt (the lean step's
cache holds the prefix's columns once for all rows: `decode_cache.SharedPromptCache`):

    columns   [ shared prefix | left padding | the prompt's own rest ]
    mask        1 ... 1         0 ... 0        1 ... 1

a prompt's positions counting its real tokens only, so its rest continues the prefix's positions
across the padding (`padding.positions`). Where no prefix saves `MIN_SHARED_TOKENS`, or the
model's forward takes no cache, the prompts run as one left-padded batch, as they always did.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hflow.engine.lm_head import logits_kwargs
from hflow.engine.padding import left_padded, positions
from hflow.engine.prompt_prefix import common_prefix

# Share a prefix only where it saves at least this many prompt tokens (its length x the other
# prompts): the shared pass is one more forward of the whole model, a fixed cost in calls.
MIN_SHARED_TOKENS = 32


def prefix_to_share(prompts: list[list[int]]) -> int:
    """The length of the prefix `prefill` runs once (`prompt_prefix.common_prefix`), or 0 where it
    saves fewer than `MIN_SHARED_TOKENS` tokens."""
    length = common_prefix(prompts)
    return length if length * (len(prompts) - 1) >= MIN_SHARED_TOKENS else 0


class Prefilled(NamedTuple):
    logits: torch.Tensor  # (G, vocab) float32: after each prompt's last token
    cache: object  # the model's KV cache, G rows
    mask: torch.Tensor  # (G, columns): how the cache's columns are laid out, 1 on real tokens
    prefix: int  # the first columns, every prompt's alike (the same keys and values in every row)


def prefill(model, prompts: list[list[int]], pad: int, device: torch.device) -> Prefilled:
    """The prompts' prefill (`Prefilled`), their common prefix run once where it pays."""
    shared = prefix_to_share(prompts)
    ids, mask = left_padded([p[shared:] for p in prompts], pad)
    ids, mask = ids.to(device), mask.to(device)
    cache = None
    if shared:
        prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=device)
        cache = model(input_ids=prefix, use_cache=True, **logits_kwargs(model, 1, shared, device)).past_key_values
        cache.batch_repeat_interleave(len(prompts))
        mask = torch.cat([mask.new_ones(len(prompts), shared), mask], 1)
    width = ids.shape[1]
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)[:, shared:], past_key_values=cache,
                use_cache=True, **logits_kwargs(model, 1, width, device))
    return Prefilled(out.logits[:, -1].float(), out.past_key_values, mask, shared)
