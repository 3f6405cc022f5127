"""Memory per device of one model under one parallel strategy, in bytes.

Model states follow the ZeRO paper's accounting (Rajbhandari et al., 2020, Section 3.1): mixed
precision Adam keeps 2 bytes of bf16 weights, 2 of gradients and K = 12 of fp32 optimizer states
(master weights, momentum, variance) per parameter; fp32 training keeps 4 + 4 + 8. Model
parallelism (tp x pp) divides all of them; ZeRO stage 1 also divides the optimizer states by the
data-parallel size, stage 2 the gradients too, stage 3 the weights too. Offload (ZeRO-Offload,
Ren et al., 2021) moves gradients and optimizer states to CPU memory.

Activations follow Korthikanti et al., 2022 ("Reducing Activation Recomputation in Large
Transformer Models", Section 4), recounted for SwiGLU MLPs and flash attention (no s x s score
matrix is kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from hflow.mapper.models import ModelShape

USABLE_FRACTION = 0.9  # of device memory: CUDA context, NCCL buffers, fragmentation (vLLM's default 0.9)
LOGIT_BYTES = 4  # logits are upcast to fp32 for the log-softmax
# ZeRO-3 gathers parameters as a forward or backward reaches them and keeps at most this many
# gathered at once: DeepSpeed's `stage3_max_live_parameters` default (runtime/zero/config.py).
ZERO3_LIVE_PARAMS = 1e9


@dataclass(frozen=True)
class ModelStates:
    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def optimizer_bytes_per_param(dtype_bytes: int) -> int:
    """Adam's states: fp32 master copy + momentum + variance under bf16, momentum + variance in fp32."""
    return 12 if dtype_bytes == 2 else 8


def model_states(params: int, dtype_bytes: int, tp: int, pp: int, dp: int, zero: int,
                 offload: bool = False, grad_bytes: int | None = None) -> ModelStates:
    """Weights, gradients and Adam states of a trained model on one device.

    `grad_bytes`: bytes per gradient element when they are not kept in the weights' dtype (fp32
    accumulation of bf16 gradients is 4); default `dtype_bytes`.
    """
    shard = params / (tp * pp)
    weights = dtype_bytes * shard
    grads = (grad_bytes or dtype_bytes) * shard
    optimizer = optimizer_bytes_per_param(dtype_bytes) * shard
    if zero >= 1:
        optimizer /= dp
    if zero >= 2:
        grads /= dp
    if zero >= 3:
        weights /= dp
    if offload:
        grads, optimizer = 0.0, 0.0
    return ModelStates(weights, grads, optimizer)


def frozen_weights(params: int, dtype_bytes: int, tp: int, pp: int) -> float:
    """An inference-only model (reference, reward, cost) keeps just its weights."""
    return dtype_bytes * params / (tp * pp)


def layer_activation_elems(shape: ModelShape, tp: int) -> float:
    """Activation elements one decoder layer keeps per token for its backward pass.

    Not split by tensor parallelism: the two norms' inputs and outputs (4h). Split: q (h), k and v
    (2 kv_dim), the attention output (h), and the MLP's gate, up and gated product (3 ffn).
    (Korthikanti et al. count 34h bytes per token for a GPT layer; this gives 32h for Llama-2-7B.)
    """
    return 4 * shape.hidden + (2 * shape.hidden + 2 * shape.kv_dim + 3 * shape.ffn) / tp


def train_activations(shape: ModelShape, lm_head: bool, micro_seqs: int, seq_len: int, tp: int,
                      checkpointing: bool, dtype_bytes: int, scored_len: float | None = None) -> float:
    """Activations of one training micro-batch on the busiest pipeline stage.

    With 1F1B the first stage holds pp micro-batches of layers/pp layers each: the whole model's
    worth of one micro-batch, whatever pp is (Korthikanti et al., Section 4.2.3).
    Checkpointing keeps each layer's input and recomputes one layer at a time. The logits are
    those of `scored_len` positions a sequence (default: all `seq_len`; hflow's own scoring runs
    the LM head on the response's positions only).
    """
    tokens = micro_seqs * seq_len
    full_layer = layer_activation_elems(shape, tp) * tokens * dtype_bytes
    if checkpointing:
        kept = shape.layers * shape.hidden * tokens * dtype_bytes + full_layer
    else:
        kept = shape.layers * full_layer
    return kept + _logits(shape, lm_head, _scored(micro_seqs, seq_len, scored_len), tp) * 2  # and their gradient


def inference_activations(shape: ModelShape, lm_head: bool, micro_seqs: int, seq_len: int, tp: int,
                          dtype_bytes: int, scored_len: float | None = None) -> float:
    """A forward pass without gradients keeps one layer's activations at a time, plus the logits
    (of `scored_len` positions a sequence: `train_activations`)."""
    tokens = micro_seqs * seq_len
    return (layer_activation_elems(shape, tp) * tokens * dtype_bytes
            + _logits(shape, lm_head, _scored(micro_seqs, seq_len, scored_len), tp))


def _scored(micro_seqs: int, seq_len: int, scored_len: float | None) -> float:
    """Positions whose logits a micro-batch computes."""
    return micro_seqs * (seq_len if scored_len is None else min(scored_len, seq_len))


def _logits(shape: ModelShape, lm_head: bool, tokens: int, tp: int) -> float:
    return tokens * (shape.vocab / tp if lm_head else 1) * LOGIT_BYTES


def kv_cache(shape: ModelShape, seqs: int, seq_len: int, tp: int, dtype_bytes: int) -> float:
    """KV cache of `seqs` sequences of `seq_len` tokens on one device of a tp-way generation group.

    KV heads are split over tp; when tp exceeds their number each device keeps one (replicated).
    """
    kv_heads_per_device = max(1, shape.kv_heads // tp)
    per_token = 2 * shape.layers * kv_heads_per_device * shape.head_dim * dtype_bytes
    return seqs * seq_len * per_token


def generation_weights(params: int, dtype_bytes: int, tp: int) -> float:
    """The actor's generation shard: 1/tp of the weights (the training shard is part of it)."""
    return dtype_bytes * params / tp


def zero3_gathered(params: int, dtype_bytes: int) -> float:
    """Full parameters a ZeRO-3 model holds at once while a pass runs: a window of layers, at most
    DeepSpeed's live-parameter limit (the rest stays partitioned)."""
    return dtype_bytes * min(params, ZERO3_LIVE_PARAMS)


def colocated_peak(resident: list[tuple[float, float, float]],
                   transient: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Bytes per device of models sharing the devices, per stage (generation, preparation, training):
    what every model keeps resident plus the largest working memory of the models running in the
    stage (colocated models run one after another)."""
    return tuple(sum(r[s] for r in resident) + max((t[s] for t in transient), default=0.0) for s in range(3))
