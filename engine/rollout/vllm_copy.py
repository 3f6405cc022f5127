"""Async mode's generator copy on vLLM: the rollout worker's engine when `rollout.engine: vllm`.

`GeneratorCopy`'s interface (`load_bucket`, `generate`, `pad`) on a `VLLMGenerator` that lives on
the rollout pool's own devices and never sleeps (nothing else runs there). vLLM reloads its
weights in one pass over an iterator of every parameter (`VLLMGenerator.load_weights`, in
place), while the actor's buckets arrive one call at a time: they are held here until the last
one of a version, then reloaded together. The held buckets are one host copy of the weights for
the length of a refresh; a Ray actor runs its calls in order, so no generation sees a part-loaded
model.
"""

from __future__ import annotations

import threading

import torch

from hflow.engine.rollout.generation import SamplingParams
from hflow.engine.rollout.vllm_engine import VLLMGenerator


class VLLMCopy:
    def __init__(self, engine: VLLMGenerator):
        self.engine = engine
        self.incoming: list[list[tuple[str, torch.Tensor]]] = []
        self.lock = threading.Lock()
        self.version = -1  # nothing loaded yet: the engine holds vLLM's dummy weights

    @property
    def pad(self) -> int:
        return self.engine.pad

    def load_bucket(self, bucket: list[tuple[str, torch.Tensor]], version: int | None) -> None:
        """One bucket of the actor's weights; with `version`, the last: vLLM reloads them all."""
        with self.lock:
            self.incoming.append(bucket)
            if version is None:
                return
            incoming, self.incoming = self.incoming, []
            self.engine.load_weights(incoming)
            self.version = version

    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams,
                 rng: torch.Generator) -> tuple[dict[str, torch.Tensor], int]:
        """`VLLMGenerator.generate`, and the policy version that generated it."""
        with self.lock:
            if self.version < 0:
                raise RuntimeError("the vLLM rollout engine never received the training weights")
            return self.engine.generate(prompt_ids, n, params, rng), self.version
