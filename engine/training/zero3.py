"""ZeRO-3 from the first byte: models partitioned while they load, and frozen models sharded too.

Without this, every rank of a ZeRO-3 group built the whole model in host memory in fp32 (4 bytes
per parameter per rank: 224 GB on an 8-GPU node for 7B) and only DeepSpeed's `initialize` then
partitioned it; the reference and reward models stayed whole on every device. Here:

- `partitioned_load(zero_stage, dtype)`: models built inside the block are created under
  `deepspeed.zero.Init` (transformers' DeepSpeed integration: `from_pretrained` sees
  `is_deepspeed_zero3_enabled()`, builds the model with empty partitioned parameters and loads
  each tensor into its owner's partition from the memory-mapped checkpoint). Each rank then holds
  1/world of the weights, in the training dtype, before DeepSpeed wraps the model.
- `frozen_engine(model, zero_stage, dtype)`: a model that is only ever run forward (reference,
  reward, cost) wrapped by DeepSpeed without an optimizer, so that under ZeRO-3 it stays
  partitioned and each layer is gathered only while the forward runs through it (as OpenRLHF
  and verl shard their reference models with the actor's strategy).
Below ZeRO-3 both leave the model alone.
"""

from __future__ import annotations

import contextlib

import torch


def zero3_config(dtype: torch.dtype) -> dict:
    """What `deepspeed.zero.Init` and a forward-only ZeRO-3 engine read: the stage and the dtype."""
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3}, "bf16": {"enabled": dtype == torch.bfloat16},
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


@contextlib.contextmanager
def partitioned_load(zero_stage: int, dtype: torch.dtype):
    """Within the block, `from_pretrained` builds ZeRO-3 models partitioned (see the module doc)."""
    if zero_stage != 3:
        yield
        return
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    marker = HfDeepSpeedConfig(zero3_config(dtype))  # transformers holds it by a weak reference
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del marker


def is_partitioned(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are ZeRO-3 partitions (each holding its `ds_numel` elements
    spread over the ranks) rather than whole tensors."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def frozen_engine(model: torch.nn.Module, zero_stage: int, dtype: torch.dtype):
    """`model` ready for forward passes only: under ZeRO-3 a DeepSpeed engine without an optimizer
    (its forward gathers each layer's partitions in turn; collective, so every rank must run the
    same forwards), below it the model itself."""
    if zero_stage != 3:
        return model
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, config=zero3_config(dtype))
    engine.eval()
    return engine
