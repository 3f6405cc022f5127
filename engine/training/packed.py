"""Scoring rows without computing their padding: every row's tokens packed into one sequence.

A micro-batch's responses end at different lengths. Run as a (rows, longest) batch, every
projection, MLP product and norm also runs on the padding after the shorter rows (11-17% more
tokens than the rows hold on `grpo/smollm2-arithmetic`'s micro-batches of 16); length buckets
cut that down only at the price of more, smaller forwards. Here the rows' real tokens go through
the model as one sequence (1, T): the products, the norms and the LM head see exactly T tokens,
in one forward. Rows that share a prompt (a prompt's n samples) follow that prompt, packed once at
the head of the same sequence: the prompt's tokens, not the widest prompt's, run once for the
group, without a second forward or a KV cache; tokens every prompt begins with (a chat template's
header, a system prompt: `prompt_prefix.py`) run once at the head of it all, and every prompt and
row attends to them first; a scoring call without gradients cut into several micro-batches runs
that prefix in its first packed forward only and hands its keys and values, layer by layer, to the
others, and an update's micro-batches run it once, forward and backward (`HeldPrefix`). Only
attention needs the rows apart: in each layer
the packed queries, keys and values are scattered into a (prompts, widest prompt) grid and a
(rows, widest) grid, attend there (a prompt causally to itself; each row to its prompt's keys,
then causally to its own tokens), and are gathered back. Attention is a small
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
from hflow.engine.kernels import grid_attention
from hflow.engine.lm_head import can_head_at, head_at, model_behind
from hflow.engine.prompt_prefix import common_prefix_of
from hflow.engine.training.held_prefix import HeldPrefix

PACKED = "hflow_packed"
LAYOUT_ATTR = "_hflow_packed_rows"  # on a packed call's attention mask: its PackedRows
# Causal LMs whose attention modules call the attention interface with (B, heads, T, head_dim)
# queries, keys and values after their rotary embedding, and use `layer_idx` (transformers').
PACKABLE_MODELS = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
# Run the prompts' common prefix once where that saves at least this many tokens (its length x the
# other prompts): below, the prefix's own attention call in every layer costs more than it saves.
MIN_SHARED_TOKENS = 16


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
        return layout.attend(query, key, value, dropout, scaling, getattr(module, "layer_idx", None)), None

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


class Grid:
    """Rows of `widths` tokens each (B,), packed one after the other: where each of the T packed
    tokens sits in a (batch, width) grid of the rows, left-aligned."""

    def __init__(self, widths: torch.Tensor):
        self.widths, self.batch = widths, len(widths)
        self.width = int(widths.max()) if self.batch else 0
        self.offsets = widths.cumsum(0) - widths  # (B,) each row's first token in the packed sequence
        self.rows = torch.repeat_interleave(torch.arange(self.batch, device=widths.device), widths)  # (T,)
        self.columns = torch.arange(len(self.rows), device=widths.device) - self.offsets[self.rows]  # (T,)
        # Each packed token's place in the grid read as (batch x width) rows: one index, so a scatter
        # is one index_copy_ and a gather one index_select (with two, `index_put` and `index`, they
        # took 2.9x as long at the 3.5M model's shapes, backward included). Every place is one token's,
        # so the backward's index_add_ never adds twice into one place: the same bits on a GPU too.
        # A row's prompt keys, where places repeat, keep plain indexing and its backward as before.
        self.flat = self.rows * self.width + self.columns  # (T,)

    @property
    def tokens(self) -> int:
        return len(self.rows)

    def scatter(self, packed: torch.Tensor) -> torch.Tensor:
        """(1, heads, T, d) packed -> (batch, heads, width, d), zero where a row has no token."""
        flat = packed[0].transpose(0, 1)  # (T, heads, d)
        grid = flat.new_zeros(self.batch * self.width, *flat.shape[1:]).index_copy_(0, self.flat, flat)
        return grid.view(self.batch, self.width, *flat.shape[1:]).transpose(1, 2)

    def gather(self, grid: torch.Tensor) -> torch.Tensor:
        """(batch, heads, width, d) -> (T, heads, d), the packed tokens' rows."""
        rows = grid.transpose(1, 2).reshape(self.batch * self.width, grid.shape[1], grid.shape[3])
        return rows.index_select(0, self.flat)


@dataclass
class PrefixAlone:
    """The layout of a forward of a held prefix's tokens alone (`run_prefix_alone`): causal
    attention over them, their keys and values kept."""

    held: HeldPrefix

    @property
    def computed_keys(self) -> int:
        return work_meter.causal_keys(1, self.held.length, 0)

    def attend(self, query, key, value, dropout: float, scaling, layer=None) -> torch.Tensor:
        self.held.keep(layer, key, value)
        out = _attention(query, key, value, dropout_p=dropout, scale=scaling, is_causal=True,
                         enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2)


def run_prefix_alone(forward, held: HeldPrefix) -> None:
    """`held`'s tokens through the model alone, with gradients, their keys and values kept."""
    ids = held.ids.to(model_behind(forward).device)
    _forward(forward, ids, torch.arange(len(ids), device=ids.device), PrefixAlone(held), ids.new_zeros(0))


@dataclass
class PackedRows:
    """The layout of a packed sequence: `rows`' tokens, after `prompts`' when given. With prompts,
    the sequence starts with each distinct prompt's tokens once (`prompts`, one grid row per
    prompt), and row b's tokens follow its prompt `groups[b]`: they attend to that prompt's
    tokens, then causally to their own. Without, each row starts at its position 0. With a
    `prefix` (only with prompts), the sequence starts with the `prefix` tokens every prompt begins
    with, once (`prompt_prefix.py`); the prompts' grid then holds each prompt's rest, which attends
    to the prefix first, and so do the rows. With a `held` prefix that has kept its keys, the
    sequence does not hold the prefix's tokens: they attend to the held keys instead."""

    rows: Grid
    prompts: Grid | None = None
    groups: torch.Tensor | None = None  # (B,) each row's prompt, with `prompts`
    prefix: int = 0
    held: HeldPrefix | None = None

    def __post_init__(self):
        # The prefix's tokens this sequence runs: all of them, or none where they are held.
        self.ran = 0 if self.held is not None and self.held.kept else self.prefix
        self.attend_mask = self.prompt_mask = None
        if self.prompts is not None:
            p, device = self.prompts, self.groups.device
            before = torch.arange(p.width, device=device)[None] < p.widths[self.groups][:, None]
            before = before[:, None, None, :].expand(-1, 1, self.rows.width, -1)
            own = torch.ones(self.rows.width, self.rows.width, dtype=torch.bool, device=device).tril()
            self.attend_mask = torch.cat([_prefix_columns(self.rows.batch, self.rows.width, self.prefix, device),
                                          before, own.expand(self.rows.batch, 1, -1, -1)], -1)
            if self.prefix:
                causal = torch.ones(p.width, p.width, dtype=torch.bool, device=device).tril()
                self.prompt_mask = torch.cat([_prefix_columns(p.batch, p.width, self.prefix, device),
                                              causal.expand(p.batch, 1, -1, -1)], -1)

    @property
    def computed_keys(self) -> int:
        """(query, key) pairs the grids' attention computes, padding included (the meter's unit)."""
        if self.prompts is None:
            return work_meter.causal_keys(self.rows.batch, self.rows.width, 0)
        return work_meter.causal_keys(1, self.ran, 0) + \
            work_meter.causal_keys(self.prompts.batch, self.prompts.width, self.prefix) + \
            work_meter.causal_keys(self.rows.batch, self.rows.width, self.prefix + self.prompts.width)

    def attend(self, query, key, value, dropout: float, scaling, layer=None) -> torch.Tensor:
        """The attention output (1, T, heads, d) of packed (1, heads, T, d) queries, keys and values
        in decoder layer `layer` (its index: where the prefix is held)."""
        attention = functools.partial(_attention, dropout_p=dropout, scale=scaling,
                                      enable_gqa=query.shape[1] != key.shape[1])
        if self.prompts is None:
            q, k, v = (self.rows.scatter(t) for t in (query, key, value))
            return self.rows.gather(attention(q, k, v, is_causal=True))[None]
        head, split = self.ran, self.ran + self.prompts.tokens
        if self.prefix and not head:
            shared_k, shared_v = self.held.of(layer)  # (1, kv_heads, prefix, d)
        else:
            shared_k, shared_v = key[:, :, :head], value[:, :, :head]
            if head and self.held is not None:
                self.held.keep(layer, shared_k, shared_v)
        parts = []
        if head:
            parts.append(attention(query[:, :, :head], shared_k, shared_v, is_causal=True)[0].transpose(0, 1))
        q, k, v = (self.prompts.scatter(t[:, :, head:split]) for t in (query, key, value))
        if self.prefix:
            out = attention(q, _after(shared_k, k), _after(shared_v, v), attn_mask=self.prompt_mask)
        else:
            out = attention(q, k, v, is_causal=True)
        parts.append(self.prompts.gather(out))
        if self.rows.tokens:
            k = torch.cat([k[self.groups], self.rows.scatter(key[:, :, split:])], 2)
            v = torch.cat([v[self.groups], self.rows.scatter(value[:, :, split:])], 2)
            out = attention(self.rows.scatter(query[:, :, split:]), _after(shared_k, k), _after(shared_v, v),
                            attn_mask=self.attend_mask)
            parts.append(self.rows.gather(out))
        return torch.cat(parts)[None]


def _prefix_columns(batch: int, width: int, prefix: int, device) -> torch.Tensor:
    """(batch, 1, width, prefix) True: every query attends to the shared prefix's keys."""
    return torch.ones(batch, 1, width, prefix, dtype=torch.bool, device=device)


def _after(shared: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The shared prefix's keys (or values) (1, heads, prefix, d) before each grid row's (R, heads, W, d)."""
    if not shared.shape[2]:
        return keys
    return torch.cat([shared.expand(keys.shape[0], -1, -1, -1), keys], 2)


def _attention(q, k, v, dropout_p: float = 0.0, **kwargs) -> torch.Tensor:
    """SDPA's attention; on a CPU without dropout, the compiled grid kernel's where it can be built
    (`engine/kernels/grid_attention.py`: torch's CPU kernel ran SmolLM2's grids at 20-32 GFLOP/s).
    On a CPU in 16-bit floats, computed in float32 and given back in the inputs' dtype: torch's CPU
    kernels for bfloat16 ran a grid's attention with its backward 2.1-3.7x slower than on the same
    values in float32 (SmolLM2's heads, a micro-batch of 32 rows: 22.6 ms against 10.6 with the row
    mask, 4.8 against 1.3 causal; docs/benchmarks.md), and float32 is the more exact."""
    if not q.is_cpu:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, **kwargs)
    dtype = q.dtype
    if dtype in (torch.bfloat16, torch.float16):
        q, k, v = q.float(), k.float(), v.float()
    kernel = grid_attention.available() if dropout_p == 0 else None
    mask = kwargs.get("attn_mask")
    if kernel is not None and grid_attention.usable(q, k, v, mask):
        out = grid_attention.attention(kernel, q, k, v, mask, kwargs.get("is_causal", False), kwargs.get("scale"))
    else:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, **kwargs)
    return out.to(dtype)


def packed_logits(forward, ids: torch.Tensor, widths: torch.Tensor, start: torch.Tensor,
                  scored: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Logits (K, V) at the K `scored` (row, column) pairs of the grid `ids` (B, >= max width): row
    b's first widths[b] tokens, at positions start[b], start[b] + 1, ..., run as one packed forward.
    Only for `can_pack` models."""
    rows = Grid(widths.to(ids.device))
    at_row, at_column = scored
    return _forward(forward, ids[rows.rows, rows.columns], start[rows.rows] + rows.columns, PackedRows(rows),
                    rows.offsets[at_row] + at_column)


def packed_prompt_logits(forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, groups: torch.Tensor,
                         ids: torch.Tensor, widths: torch.Tensor,
                         scored: tuple[torch.Tensor, torch.Tensor], held: HeldPrefix | None = None) -> torch.Tensor:
    """Rows that continue shared prompts, as one packed forward: each prompt's tokens once, then
    row b's first widths[b] tokens of `ids` (B, >= max width) after its prompt `groups[b]`; the
    tokens every prompt begins with once before them all (`shared_prefix`), or, given a `held`
    prefix, its tokens: without gradients run here if it has not kept its keys yet, else attended
    to through them and not run; with them (a `HeldPrefix` of `uses`) run alone first, once.

    `prompt_ids`, `prompt_mask`: (G, P) left-padded prompts. Returns the logits (G + K, V): at each
    prompt's last token (they predict its rows' first tokens), then at the K `scored` (row, column)
    pairs of `ids`. Only for `can_pack` models."""
    lengths = prompt_mask.sum(-1)
    if held is not None:
        if torch.is_grad_enabled() != held.trains:
            raise ValueError("a held prefix with gradients is for passes with them" if held.trains else
                             "a held prefix's keys carry no gradients: hold one only in a pass without them")
        if not held.begins(prompt_ids, prompt_mask):
            raise ValueError(f"these prompts do not all begin with the held prefix's {held.length} tokens")
        if held.trains:
            if not held.kept:
                run_prefix_alone(forward, held)
            held.begin_use()
    head = shared_prefix(prompt_ids, prompt_mask) if held is None else held.length
    prompts, rows = Grid(lengths - head), Grid(widths.to(ids.device))
    layout = PackedRows(rows, prompts, groups, head, held)
    ran = layout.ran  # the prefix's tokens at the sequence's head: all, or none where held
    # A prompt's tokens are its last `length` columns; the grid holds them from its `head`-th on.
    padding = (prompt_mask.shape[1] - lengths)[prompts.rows] + head
    first = prompt_ids[0, prompt_mask.shape[1] - lengths[0]:][:ran]
    tokens = torch.cat([first, prompt_ids[prompts.rows, padding + prompts.columns], ids[rows.rows, rows.columns]])
    positions = torch.cat([torch.arange(ran, device=ids.device), head + prompts.columns,
                           lengths[groups][rows.rows] + rows.columns])
    at_row, at_column = scored
    heads = torch.cat([ran + prompts.offsets + prompts.widths - 1,
                       ran + prompts.tokens + rows.offsets[at_row] + at_column])
    return _forward(forward, tokens, positions, layout, heads)


def shared_prefix(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> int:
    """The tokens the packed prompts all begin with, run once (`prompt_prefix.common_prefix_of`),
    where that saves `MIN_SHARED_TOKENS`; else 0."""
    head = common_prefix_of(prompt_ids, prompt_mask)
    return head if head * (len(prompt_ids) - 1) >= MIN_SHARED_TOKENS else 0


def held_prefix(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, uses: int | None = None) -> HeldPrefix | None:
    """A `HeldPrefix` of the tokens the left-padded prompts (G, P) all begin with (`shared_prefix`),
    for `uses` forwards with gradients if given; None where none is worth running once."""
    head = shared_prefix(prompt_ids, prompt_mask)
    if not head:
        return None
    start = prompt_mask.shape[1] - int(prompt_mask[0].sum())
    return HeldPrefix(prompt_ids[0, start:start + head], uses)


def _forward(forward, tokens: torch.Tensor, positions: torch.Tensor, layout: PackedRows,
             heads: torch.Tensor) -> torch.Tensor:
    """The model's forward on the packed (T,) `tokens` at `positions`, attending by `layout`, its
    head run at the packed indices `heads`: logits (len(heads), V)."""
    sentinel = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=tokens.device)
    setattr(sentinel, LAYOUT_ATTR, layout)
    model = model_behind(forward)
    model.config._attn_implementation = PACKED
    meter = work_meter.meter_of(model.get_input_embeddings())
    if meter is not None:
        meter.keys_next = layout.computed_keys
    with head_at(forward, torch.zeros_like(heads), heads):
        return forward(input_ids=tokens[None], position_ids=positions[None], attention_mask=sentinel,
                       use_cache=False).logits
