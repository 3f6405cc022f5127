"""A lean decoding step for Llama-architecture models (Llama, Qwen2): the `hf` engine's fast path.

transformers' forward spends most of a single-token step on per-layer bookkeeping (mask
building, cache objects growing by concatenation, the rotary table recomputed every step).
Decoding only needs the same arithmetic: this module runs it directly on the model's own
weights with a preallocated KV cache, a rotary table built once per batch, one rotary pass
for the query and key together, and grouped-query attention without repeating the keys.
It falls back to the plain forward for anything else (other architectures, ZeRO-3's sharded
parameters). The prefill still runs through transformers; its cache is copied in once.

On a CPU in float32 the attention is written out as two matmuls and a softmax: for one
query token that is faster than `scaled_dot_product_attention`'s kernel; elsewhere (GPU,
bfloat16) the fused kernel is used. The step multiplies in one of three layouts (`step_layout`):
on a CPU wherever torch has oneDNN (`cpu_products.decodes_packed`), the projections and the head
run on weights copied into a layout for the batch's products, q/k/v and gate/up each joined into
one product, the hidden state carried as rows: in float32 where it builds (AVX-512), the thin
products' kernel on weights packed in panels (`kernels/thin_products.c`: SmolLM2's rollout 1.22x
faster than on oneDNN's, the 27.5M and 3.5M models' 1.15x and 1.16x, 2026-12-07), else oneDNN on
weights reordered for the batch's rows; on a GPU, as rows through `F.linear` on the model's own
weights (no copy); on a CPU without oneDNN, through the BLAS as columns (`weight @ x`). The
constants below are for the BLAS's products. In float32 in that first layout, the element-wise work
between them (residual sums and RMSNorms, the rotary pass, SwiGLU, the cache's append) runs as
compiled kernels where they can be built (`engine/kernels/`, `_step_compiled`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from hflow.engine import work_meter
from hflow.engine.kernels.cpu_products import decodes_packed, packed, product
from hflow.engine.kernels import decode_attention, layers, thin_products
from hflow.engine.rollout.decode_cache import RowCache, SharedPromptCache, shares_prompts

SUPPORTED = {"LlamaForCausalLM", "Qwen2ForCausalLM"}
# With torch's BLAS: from this many rows up, a CPU's (MKL's) float32 product runs faster as
# `weight @ x` than as `F.linear(x, weight)` (1.3-2.8x at 16-32 rows); below, `F.linear` on rows
# made contiguous is 2-3x faster (2-8 rows; equal at 12). Measured at SmolLM2's and the 27M
# model's shapes, 2 threads (docs/benchmarks.md).
WEIGHT_LEFT_FROM_ROWS = 12
# On a CPU, the BLAS's `weight @ x` products of a decoding step run fast at multiples of 8 rows and
# up to 1.7x slower in between: SmolLM2's 210 products of a step took 50.6 ms at 32 rows, 85.1 at
# 31, 72.5-73.7 at 29-30, 48.5 at 24, 73.6 at 23, 34.0 at 16 (cache cold, 2 threads, AVX-512, 2026-11-27,
# benchmarks/decode_rows.py: MKL splits the rows between its threads, and some remainders take a
# slow path). The batch keeps finished rows to such a count.
CPU_ROW_MULTIPLE = 8
# On a CPU the BLAS's LM head `weight @ x` runs in slices of this many vocabulary rows, each turned
# to (rows, slice) while it is still in cache: 25-30 ms a step at SmolLM2's 49,152 x 576 head and
# 32 rows, against 34-38 ms for one product and a transposing copy of its (vocabulary, rows)
# result (cache cold, as in a decoding step; slices of 1,024-4,096 alike: benchmarks/decode_head.py).
HEAD_SLICE_ROWS = 2048


def supports(model) -> bool:
    """True for a Llama-like model whose parameters are whole (not ZeRO-3 shards)."""
    config = getattr(model, "config", None)
    if type(model).__name__ not in SUPPORTED or config is None:
        return False
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "use_sliding_window", False):
        return False
    scaling = getattr(config, "rope_scaling", None) or {}
    if scaling.get("rope_type", "default") != "default" and type(model).__name__ != "LlamaForCausalLM":
        return False  # (transformers 5 writes the default rope as a dict: {"rope_type": "default", ...})
    return not any(hasattr(p, "ds_id") for p in model.parameters())


def step_layout(weight: torch.Tensor) -> str:
    """How a decoding step on weights like this one multiplies: "packed" (the hidden state as rows,
    oneDNN's products on reordered weights: `cpu_products.decodes_packed`), "rows" (as rows,
    `F.linear` on the model's own weights: a GPU, where the layout costs nothing and every kernel
    launch counts: a bf16 SmolLM2 step is 698 operators as rows against 1,096 as columns, counting
    each call from Python once), or "columns" (as (hidden, B), `weight @ x`: the BLAS of a CPU
    without oneDNN, see `FastDecoder.step`)."""
    if weight.device.type != "cpu":
        return "rows"
    return "packed" if decodes_packed(weight) else "columns"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FastDecoder:
    """A batch being decoded: its KV cache (`decode_cache.py`) and one decoding step on it.

    The batch is `repeat` samples of each prefilled prompt (`cache` and `mask`: the prefill's, one
    row per prompt). A row's position is its own count of real tokens, so left padding never shifts
    the rotary phase.
    """

    def __init__(self, model, cache, mask: torch.Tensor, max_new_tokens: int, repeat: int = 1, prefix: int = 0):
        self.model = model
        inner = model.model
        dtype, device = cache.layers[0].keys.dtype, mask.device
        # The written-out attention (two products and a softmax) on a CPU in float32, else SDPA's.
        manual = device.type == "cpu" and dtype == torch.float32
        # The written-out attention as one compiled kernel where it can be built (`engine/kernels/`);
        # asked for only where it would run.
        kernel = decode_attention.available() if manual else None
        if shares_prompts(manual, repeat, mask.shape[1], kernel is not None, prefix):
            self.cache = SharedPromptCache(cache, mask, repeat, max_new_tokens, kernel, prefix)
        else:
            self.cache = RowCache(cache, mask, repeat, max_new_tokens, manual, kernel)
        capacity = mask.shape[1] + max_new_tokens
        # oneDNN's products on a CPU wherever it runs (`cpu_products.decodes_packed`): F.linear's
        # layout, no row-count steps (SmolLM2's 210 products: 22 to 32 ms at 12 to 32 rows,
        # smoothly, benchmarks/cpu_products.py).
        self.layout = step_layout(inner.layers[0].self_attn.q_proj.weight)
        self.next_position = mask.sum(-1).repeat_interleave(repeat)
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        probe = torch.zeros(1, 1, config.hidden_size, dtype=dtype, device=device)
        cos, sin = inner.rotary_emb(probe, torch.arange(capacity, device=device)[None])
        self.cos, self.sin = cos[0], sin[0]  # (capacity, head_dim)
        # The layers' own parameters (references, not copies), read once instead of through
        # module attribute lookups and calls at every step; in the "packed" layout, copied into
        # the step's products' own (a copy of the weights while the batch decodes).
        self.weights = [LayerWeights(layer) for layer in inner.layers]
        self.head_weight = model.lm_head.weight
        # The step's products: oneDNN's (`cpu_products.product`), or in float32 the thin products'
        # kernel where it builds (`kernels/thin_products.c`), each on weights packed for it.
        self.product = product
        if self.layout == "packed":
            rows = mask.shape[0] * repeat
            thin = thin_products.available() if dtype == torch.float32 else None
            pack = functools.partial(packed, rows=rows) if thin is None else thin.pack
            self.product = product if thin is None else thin
            for w in self.weights:
                w.pack(pack)
            self.head_weight = pack(self.head_weight)
        self.final_norm = (inner.norm.weight, inner.norm.variance_epsilon)
        # The element-wise work between the products compiled too (`engine/kernels/layers.c`),
        # where the step runs as rows on joined products in float32 (`_step_compiled`).
        self.compiled = layers.available() if kernel is not None and self.layout == "packed" else None
        half = self.head_dim // 2  # rotate_half(x) x sin is roll(x) x signed_sin (`_rotary`)
        self.signed_sin = torch.cat((-self.sin[:, :half], self.sin[:, half:]), -1)
        self.meter = work_meter.meter_of(inner.embed_tokens)  # told each step's cache length

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows, row `rows[j]` in slot j (finished sequences leave the batch; the
        cache moves only the rows that fill the holes)."""
        self.cache.select(rows)
        self.next_position = self.next_position[rows]

    def batch_rows(self, live: int, batch: int) -> int:
        """Rows to keep decoding when `live` of `batch` are unfinished: the live ones (a drop copies
        only the rows that fill the holes, `select`), on a CPU from `WEIGHT_LEFT_FROM_ROWS` up
        rounded up to a multiple of `CPU_ROW_MULTIPLE` (finished rows kept, fed padding) when it
        multiplies as columns through the BLAS."""
        if self.layout != "columns" or live < WEIGHT_LEFT_FROM_ROWS:
            return live
        return min(batch, -(-live // CPU_ROW_MULTIPLE) * CPU_ROW_MULTIPLE)

    @staticmethod
    def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of every column of x (hidden, B), as transformers' RMSNorm: normalised in
        float32, scaled in the input dtype."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(0, keepdim=True).add_(eps))
        return x32.to(x.dtype).mul_(weight[:, None])

    def _linear(self, weight: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The projection of x (in, B) as (out, B): `weight @ x`, the weight as the product's tall
        operand; on a CPU below `WEIGHT_LEFT_FROM_ROWS` rows, `F.linear` on the rows instead."""
        if x.shape[1] >= WEIGHT_LEFT_FROM_ROWS:
            out = torch.mm(weight, x)
            return out if bias is None else out.add_(bias[:, None])
        return F.linear(x.t().contiguous(), weight, bias).t()

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, vocab) after appending `tokens` (B,) to every row.

        The hidden state is carried as (hidden, B), so that every projection can be `weight @ x`:
        with a decoding batch of tens of rows, a CPU's BLAS runs a matrix product 1.3-2.8x faster
        with the weight matrix as its tall left operand than as `F.linear`'s transposed right one
        (SmolLM2's shapes, 32 rows; the LM head 2x); with a few rows, slower (`_linear`). In the
        other layouts, as rows instead (`_step_rows`)."""
        if self.meter is not None:
            self.meter.cached = self.cache.columns  # every row attends to one more, padding included
        if self.compiled is not None:
            return self._step_compiled(tokens)
        if self.layout != "columns":
            return self._step_rows(tokens)
        batch = tokens.shape[0]
        h = self.model.model.embed_tokens(tokens[:, None])[:, 0].t().contiguous()  # (hidden, B)
        cos = self.cos[self.next_position][:, None, None, :]
        sin = self.sin[self.next_position][:, None, None, :]
        group, kv_heads, head_dim = self.group, self.kv_heads, self.head_dim
        linear = self._linear
        for i, w in enumerate(self.weights):
            x = self._norm(h, w.input_norm, w.eps)
            q = linear(w.q, x, w.q_bias).t().view(batch, kv_heads, group, head_dim)
            k = linear(w.k, x, w.k_bias).t().view(batch, kv_heads, 1, head_dim)
            # One rotary pass over the query heads and the key together.
            qk = torch.cat((q, k), dim=2)
            qk = qk * cos + rotate_half(qk) * sin
            q, k = qk[:, :, :group], qk[:, :, group:]
            v = linear(w.v, x, w.v_bias).t().view(batch, kv_heads, 1, head_dim)
            self.cache.append(i, k, v)
            out = self.cache.attention(q, i, w.scale)
            h = h + linear(w.o, out.reshape(batch, -1).t(), w.o_bias)
            h = h + self._mlp(w, self._norm(h, w.post_norm, w.eps))
        self.cache.columns += 1
        self.next_position = self.next_position + 1
        h = self._norm(h, *self.final_norm)
        head = self.model.lm_head
        if self.meter is not None:
            self.meter.on_head(head, (h.t(),), None)  # the head runs below, not through its module
        return self._head(self.head_weight, h, head.bias)

    def _step_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """`step` with the hidden state carried as rows (B, hidden), as `F.linear` and oneDNN's
        products (`LayerWeights.pack`) take and give it: nothing is transposed, each norm is one
        operator in float32 (`_rms_norm`; two in 16-bit floats) and the rotary pass three (`_rotary`;
        four). With oneDNN's products,
        against (hidden, B): a step of the 3.5M model at 64 rows 3.27 ms against 3.56, base's 48.8
        against 50.0, SmolLM2's at 32 rows 39.0 against 41.4 (medians,
        `benchmarks/decode_step_ab.py`, 2026-11-27)."""
        batch, inner = tokens.shape[0], self.model.model
        h = inner.embed_tokens(tokens[:, None])[:, 0]  # (B, hidden)
        project = self.product if self.layout == "packed" else F.linear
        cos, sin = self.cos[self.next_position][:, None], self.signed_sin[self.next_position][:, None]
        for i, w in enumerate(self.weights):
            q, k, v = self._split_qkv(w.qkv_rows(project, _rms_norm(h, w.input_norm, w.eps)), cos, sin)
            self.cache.append(i, k, v)
            out = self.cache.attention(q, i, w.scale).reshape(batch, -1)
            h = h + project(out, w.o, w.o_bias)
            gate, up = w.gate_up_rows(project, _rms_norm(h, w.post_norm, w.eps))
            h = h + project(F.silu(gate).mul_(up), w.down)
        self.cache.columns += 1
        self.next_position = self.next_position + 1
        h = _rms_norm(h, *self.final_norm)
        head = self.model.lm_head
        if self.meter is not None:
            self.meter.on_head(head, (h,), None)
        return project(h, self.head_weight, head.bias).float()  # (bfloat16's logits in float32, as `_head`)

    def _step_compiled(self, tokens: torch.Tensor) -> torch.Tensor:
        """`_step_rows` with its element-wise work compiled (`kernels/layers.c`): each residual sum
        and the RMSNorm after it one pass (h summed in place), the rotary pass in place on the joined
        q/k/v product's rows, SwiGLU's silu and product one pass, the cache's append inside the
        attention's kernel; the products as in `_step_rows`. The same arithmetic in float32 up to
        summation order (about 1e-7)."""
        batch, inner, kernels = tokens.shape[0], self.model.model, self.compiled
        h = inner.embed_tokens(tokens[:, None])[:, 0].contiguous()  # (B, hidden), this step's own
        weights, rotated = self.weights, self.heads + self.kv_heads
        x = kernels.add_rms_norm(h, None, weights[0].input_norm, weights[0].eps)
        for i, w in enumerate(weights):
            rows = kernels.rotary_(self.product(x, w.qkv, w.qkv_bias), rotated, self.head_dim, self.cos,
                                   self.signed_sin, self.next_position)
            attended = self.cache.append_and_attend(i, *self._views_qkv(rows), w.scale)
            x = kernels.add_rms_norm(h, self.product(attended.reshape(batch, -1), w.o, w.o_bias), w.post_norm, w.eps)
            down = self.product(kernels.silu_mul(self.product(x, w.gate_up)), w.down)
            norm, eps = (weights[i + 1].input_norm, weights[i + 1].eps) if i + 1 < len(weights) else self.final_norm
            x = kernels.add_rms_norm(h, down, norm, eps)
        self.cache.columns += 1
        self.next_position = self.next_position + 1
        head = self.model.lm_head
        if self.meter is not None:
            self.meter.on_head(head, (x,), None)
        return self.product(x, self.head_weight, head.bias)

    def _views_qkv(self, rows: torch.Tensor):
        """q (B, kv_heads, group, head_dim), k and v (B, kv_heads, 1, head_dim): views of the joined
        q/k/v product's rows (B, (heads + 2 kv_heads) x head_dim)."""
        batch, kv_heads, head_dim = rows.shape[0], self.kv_heads, self.head_dim
        qk_width = (self.heads + kv_heads) * head_dim
        return (rows[:, :self.heads * head_dim].view(batch, kv_heads, self.group, head_dim),
                rows[:, self.heads * head_dim:qk_width].view(batch, kv_heads, 1, head_dim),
                rows[:, qk_width:].view(batch, kv_heads, 1, head_dim))

    def _split_qkv(self, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q (B, kv_heads, group, head_dim), k and v (B, kv_heads, 1, head_dim) from the joined q/k/v
        product's rows (B, (heads + 2 kv_heads) x head_dim), the rotary pass over the query and key
        heads together."""
        batch, kv_heads, head_dim = rows.shape[0], self.kv_heads, self.head_dim
        qk_width = (self.heads + kv_heads) * head_dim
        qk = self._rotary(rows[:, :qk_width].view(batch, self.heads + kv_heads, head_dim), cos, sin)
        return (qk[:, :self.heads].view(batch, kv_heads, self.group, head_dim),
                qk[:, self.heads:].view(batch, kv_heads, 1, head_dim),
                rows[:, qk_width:].view(batch, kv_heads, 1, head_dim))

    def _rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x x cos + rotate_half(x) x sin, for (B, heads, head_dim) x and `signed_sin`'s rows as `sin`:
        in 16-bit floats rounded after each product and the sum, as transformers' rotary pass rounds
        (`_rms_norm`), in float32 the sum and second product as one operator."""
        rolled = x.roll(self.head_dim // 2, -1)
        if x.dtype == torch.float32:
            return torch.addcmul(x * cos, rolled, sin)
        return x * cos + rolled * sin

    def _mlp(self, w: "LayerWeights", x: torch.Tensor) -> torch.Tensor:
        """SwiGLU of x (hidden, B) as (hidden, B), by the step's own products (`_linear`)."""
        return self._linear(w.down, F.silu(self._linear(w.gate, x, None)).mul_(self._linear(w.up, x, None)), None)

    def _head(self, weight: torch.Tensor, h: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The logits (B, vocab) in float32, contiguous, from h (hidden, B): on a CPU from
        `WEIGHT_LEFT_FROM_ROWS` rows up, slice by slice of the vocabulary (`HEAD_SLICE_ROWS`)."""
        if bias is not None or h.shape[1] < WEIGHT_LEFT_FROM_ROWS:
            return self._linear(weight, h, bias).t().float().contiguous()
        logits = h.new_empty(h.shape[1], weight.shape[0], dtype=torch.float32)
        for start in range(0, weight.shape[0], HEAD_SLICE_ROWS):
            logits[:, start:start + HEAD_SLICE_ROWS] = torch.mm(weight[start:start + HEAD_SLICE_ROWS], h).t()
        return logits


def _rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of rows h (B, hidden) as transformers' RMSNorm rounds it: normalised in float32,
    rounded to h's dtype, then scaled by the weight (in float32, one operator: the same). The step
    samples the tokens that the trainer then scores through transformers' modules, so in bfloat16
    it rounds where they round: SmolLM2's log-probs of 8 steps at 32 rows (the forward's 20 likeliest
    tokens) were 0.060 from the forward's on average (largest 0.39) with the weight applied inside
    the norm and the rotary pass fused, 0.022 (0.21) rounded as transformers rounds (2026-11-28)."""
    if h.dtype == torch.float32:
        return F.rms_norm(h, h.shape[-1:], weight, eps)
    return F.rms_norm(h, h.shape[-1:], None, eps) * weight


class LayerWeights:
    """One decoder layer's parameters and constants, as the decoding step reads them."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.eps = layer.input_layernorm.variance_epsilon
        self.q, self.q_bias = attn.q_proj.weight, attn.q_proj.bias
        self.k, self.k_bias = attn.k_proj.weight, attn.k_proj.bias
        self.v, self.v_bias = attn.v_proj.weight, attn.v_proj.bias
        self.o, self.o_bias = attn.o_proj.weight, attn.o_proj.bias
        self.scale = attn.scaling
        self.gate, self.up, self.down = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
        self.qkv = self.qkv_bias = self.gate_up = None  # joined by `pack`

    def qkv_rows(self, project, x: torch.Tensor) -> torch.Tensor:
        """The q, k and v projections of rows x (B, hidden), side by side: (B, (heads + 2 kv_heads) x
        head_dim), as one product where `pack` joined them."""
        if self.qkv is not None:
            return project(x, self.qkv, self.qkv_bias)
        return torch.cat([project(x, self.q, self.q_bias), project(x, self.k, self.k_bias),
                          project(x, self.v, self.v_bias)], -1)

    def gate_up_rows(self, project, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP's gate and up projections of rows x, as one product where `pack` joined them."""
        if self.gate_up is None:
            return project(x, self.gate), project(x, self.up)
        rows = project(x, self.gate_up)
        inter = rows.shape[1] // 2
        return rows[:, :inter], rows[:, inter:]

    @torch.no_grad()
    def pack(self, pack) -> None:
        """The matrices copied into the step's products' layout by `pack` (oneDNN's for the batch's
        rows, `cpu_products.packed`, or the thin products' panels), q, k and v joined into one, gate
        and up into another: one product each instead of three and two (at SmolLM2's shapes and 32
        rows, oneDNN's 1.34x and 1.05x faster; at the 3.5M model's and 64 rows, 1.59x and 1.22x: a
        product's fixed cost paid once)."""
        self.qkv = pack(torch.cat((self.q, self.k, self.v)))
        if self.q_bias is not None:  # Qwen2's q/k/v biases (Llama's attention_bias sets all three)
            self.qkv_bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        self.gate_up = pack(torch.cat((self.gate, self.up)))
        self.o, self.down = pack(self.o), pack(self.down)
