"""Scoring rows without computing their padding: every row's tokens packed into one sequence.

A micro-batch's responses end at different lengths. Run as a (rows, longest) batch, every
projection, MLP product and norm also runs on the padding after the shorter rows (11-17% more
tokens than the rows hold on `grpo/smollm2-arithmetic`'s micro-batches of 16); length buckets
cut that down only at the price of more, smaller forwards. Here the rows' real tokens go through
the model as one sequence (1, T): the products, the norms and the LM head see exactly T tokens,
in one forward. Only attention needs the rows apart: in each layer the packed queries, keys and
values are scattered into a (rows, widest) grid, attend there (each row to its prompt's cached
keys, if any, then causally to its own tokens), and are gathered back. Attention is a small
share of the work at these lengths (4 x hidden FLOPs a key against 2 x parameters a token), so
the grid's padding costs little; grouped-query attention runs without repeating the keys.

The model's own forward runs (DeepSpeed's engine, LoRA, ZeRO-3's hooks and the work meter see an
ordinary forward); only its attention kernel is replaced, through transformers' attention
interface. A model that packs is switched to the implementation `hflow_packed`, which is
transformers' SDPA attention (and SDPA's mask) for every call but a packed one. A packed call is
recognised by its attention mask, a 4D tensor (transformers passes such a mask to the attention
untouched) that carries the layout (`PackedRows`): a generation running through the same model on
another thread, or activation checkpointing recomputing a layer in the backward, each get the
right attention, whatever thread they run on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hflow.engine import work_meter
from hflow.engine.lm_head import can_head_at, head_at, model_behind

PACKED = "hflow_packed"
LAYOUT_ATTR = "_hflow_packed_rows"  # on a packed call's attention mask: its PackedRows
# Causal LMs whose attention modules call the attention interface with (B, heads, T, head_dim)
# queries, keys and values after their rotary embedding, and use `layer_idx` (transformers').
PACKABLE_MODELS = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


@functools.cache
def _registered() -> bool:
    """`hflow_packed` in transformers' attention and mask interfaces, once, when a model first asks
    (importing them loads transformers' modeling code, which a model's loading does anyway); False
    where this transformers has no such interfaces."""
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False

    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
        layout = getattr(attention_mask, LAYOUT_ATTR, None)
        if layout is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        return layout.attend(module.layer_idx, query, key, value, dropout, scaling), None

    AttentionInterface.register(PACKED, attention)
    AttentionMaskInterface.register(PACKED, sdpa_mask)
    return True


def can_pack(forward) -> bool:
    """Whether `forward`'s model can score packed rows: a `PACKABLE_MODELS` model on SDPA attention
    (or already packing), without sliding windows, whose LM head can run on chosen positions."""
    model = model_behind(forward)
    config = getattr(model, "config", None)
    if type(model).__name__ not in PACKABLE_MODELS or config is None or not can_head_at(forward):
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    return config._attn_implementation in ("sdpa", PACKED) and _registered()


@dataclass
class PackedRows:
    """Where each packed token sits in the (batch, width) grid of rows, and what the rows attend to
    before their own tokens: `prompt` = (the prompts' KV cache, each row's prompt index (B,), the
    prompts' attention mask (G, P)), or None (each row starts at its position 0)."""

    rows: torch.Tensor  # (T,) each token's row
    columns: torch.Tensor  # (T,) its column in the row
    batch: int
    width: int
    prompt: tuple | None = None

    def __post_init__(self):
        self.attend_mask = None
        if self.prompt is not None:
            _, groups, prompt_mask = self.prompt
            device = prompt_mask.device
            before = prompt_mask.bool()[groups][:, None, None, :].expand(-1, 1, self.width, -1)
            own = torch.ones(self.width, self.width, dtype=torch.bool, device=device).tril()
            self.attend_mask = torch.cat([before, own.expand(self.batch, 1, -1, -1)], -1)

    @property
    def computed_keys(self) -> int:
        """(query, key) pairs the grid's attention computes, padding included (the meter's unit)."""
        before = 0 if self.prompt is None else self.prompt[2].shape[1]
        return work_meter.causal_keys(self.batch, self.width, before)

    def grid(self, packed: torch.Tensor) -> torch.Tensor:
        """(1, heads, T, d) packed -> (B, heads, width, d), zero where a row has no token."""
        flat = packed[0].transpose(0, 1)
        grid = flat.new_zeros(self.batch, self.width, *flat.shape[1:]).index_put((self.rows, self.columns), flat)
        return grid.transpose(1, 2)

    def attend(self, layer: int, query, key, value, dropout: float, scaling) -> torch.Tensor:
        """The attention output (1, T, heads, d) of packed (1, heads, T, d) queries, keys and values."""
        q, k, v = self.grid(query), self.grid(key), self.grid(value)
        if self.prompt is not None:
            cache, groups, _ = self.prompt
            cached = cache.layers[layer]
            k = torch.cat([cached.keys[groups], k], 2)
            v = torch.cat([cached.values[groups], v], 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.attend_mask, dropout_p=dropout, scale=scaling,
                                             is_causal=self.prompt is None, enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(1, 2)[self.rows, self.columns][None]


def packed_logits(forward, ids: torch.Tensor, widths: torch.Tensor, start: torch.Tensor,
                  scored: tuple[torch.Tensor, torch.Tensor], prompt: tuple | None = None) -> torch.Tensor:
    """Logits (K, V) at the K `scored` (row, column) pairs of the grid `ids` (B, >= max width): row
    b's first widths[b] tokens, at positions start[b], start[b] + 1, ..., run as one packed forward
    (after `prompt`'s cached keys, see `PackedRows`). Only for `can_pack` models."""
    widths = widths.to(ids.device)
    rows = torch.repeat_interleave(torch.arange(len(widths), device=ids.device), widths)
    offsets = widths.cumsum(0) - widths
    columns = torch.arange(len(rows), device=ids.device) - offsets[rows]
    layout = PackedRows(rows, columns, len(widths), int(widths.max()), prompt)
    sentinel = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=ids.device)
    setattr(sentinel, LAYOUT_ATTR, layout)
    model = model_behind(forward)
    model.config._attn_implementation = PACKED
    meter = work_meter.meter_of(model.get_input_embeddings())
    if meter is not None:
        meter.keys_next = layout.computed_keys
    at_row, at_column = scored
    with head_at(forward, torch.zeros_like(at_row), offsets[at_row] + at_column):
        return forward(input_ids=ids[rows, columns][None], position_ids=(start[rows] + columns)[None],
                       attention_mask=sentinel, use_cache=False).logits
