"""The KV cache of a batch being decoded by the lean step (`fast_decode.py`), in one of two layouts.

A batch's rows are its prompts' samples: prompt g's `repeat` samples are rows g x repeat ... . The
prefill runs each prompt once; its keys and values are then either

  repeated  copied to every sample's row (`RowCache`): each row attends to its own buffer, the
            prompt's columns included, as two batched products per layer and step;
  shared    kept once per prompt (`SharedPromptCache`): each prompt's samples attend to its keys
            together, as one product per prompt and head, and to their own tokens row by row.

Sharing reads a prompt's keys and values once per step instead of once per sample, and holds them
once. On a CPU in float32 both layouts attend through one compiled kernel where it can be built
(`engine/kernels/decode_attention.c`), and there sharing was as fast or faster at every shape
measured, from 8 prompt tokens x 4 samples (equal) to 268 x 8 (1.41x) and 512 x 16 (1.54x), the
attention of all of a step's layers (2026-11-29, docs/benchmarks.md): it is taken from two samples
up. With torch's products instead (no compiler), sharing costs more work per step (the rows
gathered into their prompts' grids and back) and with SmolLM2's heads (and the 3.5M model's where
two figures are given), 30 layers and all rows live, it ran 0.82-0.92x as fast as repeating at 45-64
prompt tokens x 4 samples, 1.04x at 96, 1.14-1.20x at 128, 1.30x at 192, 1.43x at 256 and 1.67x
at 256 x 16 samples (2026-11-27): then it is taken from `SHARED_PROMPT_KEYS` repeated prompt keys a
row reads per step. Elsewhere (a GPU's fused attention, bfloat16) the prompt is repeated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hflow.engine.kernels.decode_attention import DecodeAttention

# Share prompts from this many prompt keys that each step would read again for a prompt's other
# samples: (repeat - 1) x prompt width (the crossover above lies between 192 and 288).
SHARED_PROMPT_KEYS = 384


def shares_prompts(manual: bool, repeat: int, prompt_width: int, compiled: bool, prefix: int = 0) -> bool:
    """Whether a batch of `repeat` samples per prompt of `prompt_width` columns decodes on a
    `SharedPromptCache` (only with the written-out attention: `manual`; with the `compiled` kernel
    from two samples up, or where the prompts begin with a `prefix` alike, else from
    `SHARED_PROMPT_KEYS` repeated keys)."""
    if not manual or (repeat < 2 and not (compiled and prefix)):
        return False
    return compiled or (repeat - 1) * prompt_width >= SHARED_PROMPT_KEYS


def _buffers(layer, rows: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = layer.keys
    keys = k.new_zeros(rows, k.shape[1], capacity, k.shape[3])
    return keys, torch.zeros_like(keys)


def _padding(mask: torch.Tensor, manual: bool) -> torch.Tensor:
    """(rows, 1, 1, columns): an additive mask (0, -inf at padding) for the written-out attention,
    else a boolean one (True: attended)."""
    pad = mask == 0
    if manual:
        return torch.zeros(pad.shape, dtype=torch.float32, device=mask.device).masked_fill(pad, float("-inf"))[:, None, None]
    return ~pad[:, None, None]


class RowCache:
    """Every row's keys and values in one preallocated buffer per layer: its prompt's (the prefill's,
    repeated to each sample) then its own tokens'. Every row's next token goes into the same column
    (`columns`); only the prompts' left padding is ever masked (columns past the prompt are real
    tokens, or padding fed to finished rows, which nobody reads)."""

    def __init__(self, prefill, mask: torch.Tensor, repeat: int, max_new_tokens: int, manual: bool,
                 kernel: DecodeAttention | None = None):
        self.columns = mask.shape[1]  # filled so far
        self.manual = manual
        self.kernel = kernel  # the written-out attention compiled (`manual` only), or None: torch's
        self.keys, self.values = [], []
        for layer in prefill.layers:
            keys, values = _buffers(layer, mask.shape[0] * repeat, self.columns + max_new_tokens)
            for buffer, part in ((keys, layer.keys), (values, layer.values)):
                buffer.view(-1, repeat, *buffer.shape[1:])[:, :, :, :self.columns] = part[:, None]
            self.keys.append(keys)
            self.values.append(values)
        attend = mask.new_ones(mask.shape[0], self.columns + max_new_tokens)
        attend[:, :self.columns] = mask
        self.attend = _padding(attend, manual).repeat_interleave(repeat, 0)

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Layer i's keys and values (B, kv_heads, 1, head_dim) of the step's tokens."""
        self.keys[i][:, :, self.columns:self.columns + 1] = k
        self.values[i][:, :, self.columns:self.columns + 1] = v

    def attention(self, q: torch.Tensor, i: int, scale: float) -> torch.Tensor:
        """q (B, kv_heads, group, head_dim) against layer i's filled columns, the step's included."""
        end = self.columns + 1
        if self.kernel is not None:
            return self.kernel(q, self.keys[i], self.values[i], self.attend, end, scale)
        keys, values, attend = self.keys[i][:, :, :end], self.values[i][:, :, :end], self.attend[..., :end]
        if self.manual:
            scores = torch.matmul(q * scale, keys.transpose(-1, -2)).add_(attend)
            return torch.matmul(scores.softmax(-1), values)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=attend, scale=scale)

    def append_and_attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          scale: float) -> torch.Tensor:
        """`append`, then `attention`; through the kernel in one pass, each row and head writing its
        key and value where it reads them next (k and v: views of one tensor's rows)."""
        if self.kernel is None:
            self.append(i, k, v)
            return self.attention(q, i, scale)
        return self.kernel(q, self.keys[i], self.values[i], self.attend, self.columns + 1, scale, new=(k, v))

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows, row `rows[j]` in slot j, compacted in place: only the rows whose slot
        changes are copied, only the columns filled so far; the buffers keep their capacity."""
        _compact(self.keys, self.values, rows, self.columns)
        self.attend = self.attend[rows]


class SharedPromptCache:
    """Each prompt's keys and values once (the prefill's, G prompts), each row's own tokens' in a
    preallocated buffer per layer. A prompt's samples sit in a (G x repeat) grid; `grid` holds each
    batch row's place in it (rows leave the batch, their places stay until their whole prompt has
    left: `select`). With the compiled kernel, the first `prefix` columns, which every prompt's
    prefill shares (`prefill.py`: the same tokens, so the same keys and values), are held once for
    all the rows, and each prompt holds only its rest."""

    def __init__(self, prefill, mask: torch.Tensor, repeat: int, max_new_tokens: int,
                 kernel: DecodeAttention | None = None, prefix: int = 0):
        self.prompt = mask.shape[1]
        self.columns = self.prompt  # attended so far: the prompt's columns, then the rows' own
        self.repeat = repeat
        head = prefix if kernel is not None else 0  # torch's products read the prompts whole
        self.prefix = [(layer.keys[:1, :, :head].contiguous(), layer.values[:1, :, :head].contiguous())
                       for layer in prefill.layers] if head else None  # (1, kv_heads, prefix, head_dim)
        self.prompt_keys = [layer.keys[:, :, head:].contiguous() for layer in prefill.layers]  # (G, kv_heads, P, hd)
        self.prompt_values = [layer.values[:, :, head:].contiguous() for layer in prefill.layers]
        self.prompt_attend = _padding(mask[:, head:], True)  # (G, 1, 1, P)
        self.keys, self.values = map(list, zip(*(_buffers(layer, mask.shape[0] * repeat, max_new_tokens)
                                                 for layer in prefill.layers)))
        self.grid = torch.arange(mask.shape[0] * repeat, device=mask.device)
        self.prompt_of = self.grid // repeat  # each row's prompt among those held
        self.kernel = kernel  # one compiled pass over both parts, or None: torch's products

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        own = self.columns - self.prompt
        self.keys[i][:, :, own:own + 1] = k
        self.values[i][:, :, own:own + 1] = v

    def attention(self, q: torch.Tensor, i: int, scale: float) -> torch.Tensor:
        """q (B, kv_heads, group, head_dim): each prompt's samples' queries against its keys in one
        product per head, each row's against its own tokens', one softmax over both."""
        own = self.columns - self.prompt + 1
        if self.kernel is not None:
            return self.kernel.shared(q, self.prompt_keys[i], self.prompt_values[i], self.prompt_attend, self.prompt_of,
                                      self.keys[i], self.values[i], own, scale, prefix=self._prefix(i))
        q = q * scale
        keys, values = self.keys[i][:, :, :own], self.values[i][:, :, :own]
        prompt = self._from_grid(torch.matmul(self._to_grid(q), self.prompt_keys[i].transpose(-1, -2))
                                 .add_(self.prompt_attend))
        probs = torch.cat([prompt, torch.matmul(q, keys.transpose(-1, -2))], -1).softmax(-1)
        out = self._from_grid(torch.matmul(self._to_grid(probs[..., :self.prompt]), self.prompt_values[i]))
        return out.add_(torch.matmul(probs[..., self.prompt:], values))

    def append_and_attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          scale: float) -> torch.Tensor:
        """`RowCache.append_and_attend`, on the prompts held once."""
        if self.kernel is None:
            self.append(i, k, v)
            return self.attention(q, i, scale)
        return self.kernel.shared(q, self.prompt_keys[i], self.prompt_values[i], self.prompt_attend, self.prompt_of,
                                  self.keys[i], self.values[i], self.columns - self.prompt + 1, scale, new=(k, v),
                                  prefix=self._prefix(i))

    def _prefix(self, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer i's keys and values of the columns every row reads first, or None."""
        return None if self.prefix is None else self.prefix[i]

    def _to_grid(self, rows: torch.Tensor) -> torch.Tensor:
        """(B, kv_heads, group, C) rows -> (G, kv_heads, repeat x group, C), zero at rows that left."""
        batch, kv_heads, group, width = rows.shape
        prompts = len(self.prompt_keys[0])
        grid = rows.new_zeros(prompts * self.repeat, kv_heads, group, width).index_copy_(0, self.grid, rows)
        return grid.view(prompts, self.repeat, kv_heads, group, width).transpose(1, 2).reshape(
            prompts, kv_heads, self.repeat * group, width)

    def _from_grid(self, grid: torch.Tensor) -> torch.Tensor:
        """`_to_grid`'s inverse: the batch's rows (B, kv_heads, group, C)."""
        prompts, kv_heads, _, width = grid.shape
        rows = grid.view(prompts, kv_heads, self.repeat, -1, width).transpose(1, 2)
        return rows.reshape(prompts * self.repeat, kv_heads, -1, width).index_select(0, self.grid)

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows (`RowCache.select`); once a quarter of the prompts held have no row left,
        only the others' keys and values are kept (a copy), so that no step reads a finished
        prompt's for long."""
        _compact(self.keys, self.values, rows, self.columns - self.prompt)
        self.grid = self.grid[rows]
        groups = self.grid // self.repeat
        live = torch.unique(groups)  # sorted
        if 4 * len(live) <= 3 * len(self.prompt_keys[0]):
            self.prompt_keys = [k[live] for k in self.prompt_keys]
            self.prompt_values = [v[live] for v in self.prompt_values]
            self.prompt_attend = self.prompt_attend[live]
            self.grid = torch.searchsorted(live, groups) * self.repeat + self.grid % self.repeat
        self.prompt_of = self.grid // self.repeat


def _compact(keys: list, values: list, rows: torch.Tensor, filled: int) -> None:
    """Row `rows[j]` of every buffer into slot j, in place (only the rows whose slot changes, only
    the `filled` columns); each buffer is then viewed as its first len(rows) slots."""
    moved = (rows != torch.arange(len(rows), device=rows.device)).nonzero().squeeze(-1)
    source = rows[moved]
    for buffers in (keys, values):
        for i, t in enumerate(buffers):
            t[moved, :, :filled] = t[source, :, :filled]
            buffers[i] = t[:len(rows)]
