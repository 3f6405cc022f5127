"""The `hf` engine under ZeRO-3: whole weights for the rollout, gathered once, not once per token.

Generating on a ZeRO-3 training module runs transformers' forward through DeepSpeed's hooks, which
all-gather every layer's partitions for every forward: each generated token re-gathers the whole
model (a 7B policy, 512 new tokens: 7 TB moved per rollout), every rank must decode in lockstep
because each forward is collective, and the lean decoding step (`fast_decode.py`) cannot run on
partitioned parameters. This engine does what the `vllm` engine does instead: at the switch to
rollout it receives the current weights bucket by bucket (`weight_sync.weight_buckets`: one
all-gather per bucket), generates on them with the ordinary `HFGenerator` (fast path, no
collectives, ranks independent), and at the switch back to training frees them. The price is the
model's weights in the generation dtype during rollout only, as a tensor-parallel size 1 vLLM
would hold.

The module is built once on the meta device (no memory), its buffers (the rotary tables) copied
from the training module; `load_weights` allocates each parameter and fills it, `release` gives
the memory back. It follows `VLLMGenerator`'s phase protocol (`hybrid.PhaseSwitch`).
"""

from __future__ import annotations

from typing import Iterable

import torch

from hflow.engine.rollout.generation import HFGenerator, SamplingParams
from hflow.engine.rollout.vllm_weights import Bucket, flatten


class GatheredGenerator:
    def __init__(self, train_module: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                 eos_token_ids: list[int], pad_token_id: int, batch_size: int):
        from transformers import AutoModelForCausalLM

        base = train_module.get_base_model() if hasattr(train_module, "get_base_model") else train_module
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(base.config, dtype=dtype)
        model.to_empty(device=device)
        buffers = dict(base.named_buffers())
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
        model.eval().requires_grad_(False)
        self.model, self.device, self.dtype = model, device, dtype
        self.params = dict(model.named_parameters())
        self.tied = getattr(model.config, "tie_word_embeddings", False)
        self.release()
        self.generator = HFGenerator(model, eos_token_ids, pad_token_id, batch_size)

    @property
    def pad(self) -> int:
        return self.generator.pad

    def load_weights(self, buckets: Iterable[Bucket]) -> None:
        """Allocate every parameter and fill it from `buckets` (the training weights, merged LoRA
        included, under Hugging Face names)."""
        seen = set()
        with torch.no_grad():
            for name, tensor in flatten(buckets):
                if name not in self.params:
                    raise RuntimeError(f"the rollout model has no parameter {name!r}: the weights sent are "
                                       "not of this model")
                param = self.params[name]
                param.data = torch.empty(tensor.shape, dtype=self.dtype, device=self.device)
                param.copy_(tensor)
                seen.add(name)
        missing = set(self.params) - seen
        if self.tied and missing == {"lm_head.weight"}:  # one tensor under two names, sent once
            self.params["lm_head.weight"].data = self.params["model.embed_tokens.weight"].data
            missing = set()
        if missing:
            raise RuntimeError(f"the weight sync left {len(missing)} rollout parameters empty, e.g. {min(missing)!r}")

    def release(self) -> None:
        """Free the weights (until the next `load_weights`)."""
        for param in self.params.values():
            param.data = torch.empty(0, dtype=self.dtype, device=self.device)

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        if any(p.numel() == 0 for p in self.params.values()):
            raise RuntimeError("the rollout model holds no weights: generate only between load_weights and release")
        return self.generator.generate(prompts, n, params, generator)

    def drift_from(self, state: dict[str, torch.Tensor]) -> float:
        """Largest |difference| between the weights held and a state dict (0.0 right after a sync)."""
        return max((float((self.params[n].float() - t.to(self.device).float()).abs().max()) for n, t in state.items()),
                   default=float("inf"))
