"""The actor's policy as a worker loads it: the weights (each rank's partition under ZeRO-3), the
tokenizer and end tokens, LoRA adapters, and the vLLM engine it may generate with. The actor loads
it to train (`ActorWorker.init_model`, which wraps it in DeepSpeed) or for generation alone
(`init_generation`, an evaluation); the rollout worker builds its vLLM engine the same way."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hflow.engine import work_meter
from hflow.engine.models.loading import eos_token_ids, load_causal_lm, load_tokenizer, resolve_dtype
from hflow.engine.models.lora import apply_lora
from hflow.engine.rollout.vllm_engine import VLLMGenerator
from hflow.engine.specs import ActorSpec
from hflow.engine.training.zero3 import is_partitioned, partitioned_load


@dataclass
class LoadedPolicy:
    model: torch.nn.Module
    tokenizer: object
    eos: list[int]
    dtype: torch.dtype  # the training dtype, in which it also generates


def load_policy(spec: ActorSpec, device: torch.device) -> LoadedPolicy:
    """The policy of `spec.model` on the host (under ZeRO-3: each rank's partition, already on the
    device), with its adapters when `spec.lora` is set, its passes counted per phase (`work_meter`).
    Loaded in the training dtype (fp32 first only for LoRA, whose adapters start in fp32); under
    ZeRO-3 each rank builds only its partition of the weights (`zero3.py`)."""
    m = spec.model
    dtype = resolve_dtype(m.dtype, device)
    with partitioned_load(spec.optim.zero_stage, dtype):
        model = load_causal_lm(m.path, torch.float32 if spec.lora else dtype, m.trust_remote_code)
    tokenizer = load_tokenizer(m.path, m.trust_remote_code)
    eos = eos_token_ids(model, tokenizer)
    model = with_adapters(model, spec)
    work_meter.attach(model, "actor")  # what its passes compute, per phase (`work_meter.py`)
    return LoadedPolicy(model, tokenizer, eos, dtype)


def to_device(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """The whole model onto the device in `dtype` (zero.Init placed ZeRO-3's partitions already)."""
    if not is_partitioned(model):
        model.to(device=device, dtype=dtype)


def with_adapters(model, spec: ActorSpec):
    """LoRA adapters on `model` when the spec has them (only they train). Adapters start from
    the run's seed, so every rank starts the same; a checkpoint's trained weights (all of
    them, or the adapters) are restored afterwards, one tensor at a time (`TrainEngine.load`,
    `saved_weights.py`)."""
    if spec.lora is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model = apply_lora(model, spec.lora, "actor", spec.model.path)
        if spec.model.gradient_checkpointing:
            model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks need a grad input
    return model


def create_vllm(spec: ActorSpec, rank: int, world_size: int, device: torch.device, dtype: torch.dtype,
                eos: list[int], pad_token_id: int, config) -> VLLMGenerator:
    """A vLLM engine with the actor's settings on this rank (the actor's, or `workers/rollout.py`'s).
    Created before the weights take device memory: on a GPU vLLM sizes its KV cache from the free
    memory it sees at start-up, then sleeps and gives it all back until the first rollout."""
    r = spec.rollout
    return VLLMGenerator.create(
        spec.model.path, dtype=dtype, eos_token_ids=eos, pad_token_id=pad_token_id,
        max_model_len=r.max_prompt_length + r.max_response_length,
        batch_size=r.batch_size, tensor_parallel_size=r.tensor_parallel_size,
        gpu_memory_utilization=r.gpu_memory_utilization, enforce_eager=r.enforce_eager,
        trust_remote_code=spec.model.trust_remote_code, seed=spec.seed, rank=rank,
        world_size=world_size, device=device, model_config=config,
    )
