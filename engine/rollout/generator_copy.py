"""The generator copy of asynchronous rollout (`trainer.mode: async`): a second, frozen copy of
the policy that generates the next steps' rollouts while the training module trains: in the
actor's process (the local backend), or on a pool of its own as the `rollout` role's worker
(`workers/rollout.py`, the ray backend), which receives the weights bucket by bucket through
Ray's object store (`load_bucket`).

The hybrid engine (`hybrid.py`) generates on the training module itself, so rollout and update
take turns. Running ahead of training needs weights that stay put during an update: this copy
is loaded once and refreshed after every update from the training module, bucket by bucket
(`weight_sync.weight_buckets`, the same stream vLLM's sync uses; with LoRA, the merged weights).
Its `version` is the policy version it holds (the number of steps trained when it was
refreshed), stamped on every row it generates (`columns.POLICY_VERSION`).

A lock makes a refresh and a generation exclusive: a generation runs start to end on one version,
and a refresh waits for the generation in progress. `cancel()` stops a generation in progress at
its next token (`generation.GenerationCancelled`): the run is ending, and the thread generating
must not outlive it. The copy costs one more set of weights in the
generation dtype (no gradients, no optimizer state).
"""

from __future__ import annotations

import threading

import torch

from hflow.engine.models.loading import eos_token_ids, load_causal_lm
from hflow.engine.rollout.generation import HFGenerator, SamplingParams
from hflow.engine.rollout.weight_sync import SyncStats, weight_buckets


class GeneratorCopy:
    def __init__(self, path: str, trust_remote_code: bool, device: torch.device, dtype: torch.dtype,
                 tokenizer, batch_size: int, bucket_bytes: int):
        with torch.random.fork_rng(devices=[]):  # loading initialises weights: keep the run's RNG stream
            model = load_causal_lm(path, torch.float32, trust_remote_code)
        eos, pad_token_id = eos_token_ids(model, tokenizer), tokenizer.pad_token_id
        model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.model = model
        self.dtype = dtype
        self.bucket_bytes = bucket_bytes
        self.params = dict(model.named_parameters())
        self.generator = HFGenerator(model, eos, pad_token_id, batch_size)
        self.generator.cancel = threading.Event()
        self.lock = threading.Lock()
        self.version = -1  # nothing copied yet

    @property
    def pad(self) -> int:
        return self.generator.pad

    def refresh(self, train_module: torch.nn.Module, version: int, zero3: bool = False) -> SyncStats:
        """Copy the training weights in (waiting for a generation in progress); now at `version`."""
        stats = SyncStats()
        with self.lock:
            for bucket in weight_buckets(train_module, self.bucket_bytes, self.dtype, zero3, stats):
                self._copy(bucket)
            self.version = version
        return stats

    def load_bucket(self, bucket: list[tuple[str, torch.Tensor]], version: int | None) -> None:
        """One bucket of `weight_buckets` received from elsewhere (the actor on another pool); with
        `version`, the last one: the copy now holds that policy version."""
        with self.lock:
            self._copy(bucket)
            if version is not None:
                self.version = version

    @torch.no_grad()
    def _copy(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in bucket:
            if name not in self.params:
                raise RuntimeError(f"the generator copy has no parameter {name!r}: the weights sent are "
                                   "not of this model")
            self.params[name].copy_(tensor)

    def cancel(self) -> None:
        """End the generation in progress, and any later one, at its next token (from any thread)."""
        self.generator.cancel.set()

    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams,
                 rng: torch.Generator) -> tuple[dict[str, torch.Tensor], int]:
        """`HFGenerator.generate` on this copy, and the policy version that generated it."""
        with self.lock:
            if self.version < 0:
                raise RuntimeError("the generator copy was never refreshed from the training weights")
            return self.generator.generate(prompt_ids, n, params, rng), self.version
