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
bfloat16) the fused kernel is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hflow.engine import work_meter

SUPPORTED = {"LlamaForCausalLM", "Qwen2ForCausalLM"}


def supports(model) -> bool:
    """True for a Llama-like model whose parameters are whole (not ZeRO-3 shards)."""
    config = getattr(model, "config", None)
    if type(model).__name__ not in SUPPORTED or config is None:
        return False
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "use_sliding_window", False):
        return False
    if getattr(config, "rope_scaling", None) not in (None, {}) and type(model).__name__ != "LlamaForCausalLM":
        return False
    return not any(hasattr(p, "ds_id") for p in model.parameters())


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FastDecoder:
    """The KV cache of a batch being decoded, and one decoding step on it.

    Every row's next token goes into the same cache column (`length`); a row's position is
    its own count of real tokens, so left padding never shifts the rotary phase.
    """

    def __init__(self, model, cache, mask: torch.Tensor, max_new_tokens: int):
        self.model = model
        inner = model.model
        self.length = mask.shape[1]  # columns filled so far
        capacity = self.length + max_new_tokens
        self.keys, self.values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values
            keys = k.new_zeros(k.shape[0], k.shape[1], capacity, k.shape[3])
            values = torch.zeros_like(keys)
            keys[:, :, :self.length] = k
            values[:, :, :self.length] = v
            self.keys.append(keys)
            self.values.append(values)
        dtype, device = self.keys[0].dtype, mask.device
        # Columns past the prompt are always real tokens (finished rows are fed padding
        # tokens that nobody reads), so only the prompt's padding is ever masked.
        self.manual = device.type == "cpu" and dtype == torch.float32
        pad = torch.zeros(mask.shape[0], capacity, dtype=torch.bool, device=device)
        pad[:, :self.length] = mask == 0
        if self.manual:
            self.attend = torch.zeros(pad.shape, dtype=dtype, device=device).masked_fill(pad, float("-inf"))
        else:
            self.attend = ~pad
        self.attend = self.attend[:, None, None, :]
        self.next_position = mask.sum(-1)
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        probe = torch.zeros(1, 1, config.hidden_size, dtype=dtype, device=device)
        cos, sin = inner.rotary_emb(probe, torch.arange(capacity, device=device)[None])
        self.cos, self.sin = cos[0], sin[0]  # (capacity, head_dim)
        # The layers' own parameters (references, not copies), read once instead of through
        # module attribute lookups and calls at every step.
        self.weights = [LayerWeights(layer) for layer in inner.layers]
        self.final_norm = (inner.norm.weight, inner.norm.variance_epsilon)
        self.meter = work_meter.meter_of(inner.embed_tokens)  # told each step's cache length

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished sequences leave the batch)."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.attend = self.attend[rows]
        self.next_position = self.next_position[rows]

    @staticmethod
    def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, eps)
        # As transformers' RMSNorm: normalise in float32, scale in the input dtype.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)

    def _attention(self, q: torch.Tensor, i: int, end: int, scale: float) -> torch.Tensor:
        """q (B, kv_heads, group, head_dim) against the cache's first `end` columns."""
        keys, values = self.keys[i][:, :, :end], self.values[i][:, :, :end]
        attend = self.attend[..., :end]
        if self.manual:
            scores = torch.matmul(q * scale, keys.transpose(-1, -2)).add_(attend)
            return torch.matmul(scores.softmax(-1), values)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=attend, scale=scale)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, vocab) after appending `tokens` (B,) to every row."""
        batch = tokens.shape[0]
        slot = self.length
        if self.meter is not None:
            self.meter.cached = slot  # every row attends to slot + 1 columns, padding included
        h = self.model.model.embed_tokens(tokens[:, None])
        cos = self.cos[self.next_position][:, None, None, :]
        sin = self.sin[self.next_position][:, None, None, :]
        group, kv_heads, head_dim = self.group, self.kv_heads, self.head_dim
        for i, w in enumerate(self.weights):
            x = self._norm(h, w.input_norm, w.eps)
            q = F.linear(x, w.q, w.q_bias).view(batch, kv_heads, group, head_dim)
            k = F.linear(x, w.k, w.k_bias).view(batch, kv_heads, 1, head_dim)
            # One rotary pass over the query heads and the key together.
            qk = torch.cat((q, k), dim=2)
            qk = qk * cos + rotate_half(qk) * sin
            self.keys[i][:, :, slot:slot + 1] = qk[:, :, group:]
            self.values[i][:, :, slot:slot + 1] = F.linear(x, w.v, w.v_bias).view(batch, kv_heads, 1, head_dim)
            out = self._attention(qk[:, :, :group], i, slot + 1, w.scale)
            h = h + F.linear(out.reshape(batch, 1, -1), w.o, w.o_bias)
            x = self._norm(h, w.post_norm, w.eps)
            h = h + F.linear(F.silu(F.linear(x, w.gate)) * F.linear(x, w.up), w.down)
        self.length = slot + 1
        self.next_position = self.next_position + 1
        h = self._norm(h, *self.final_norm)
        return self.model.lm_head(h)[:, -1].float()


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
