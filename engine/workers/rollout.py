"""The rollout worker: asynchronous mode's generator on a pool of its own (the ray backend).

In `trainer.mode: async` on the ray backend the actor trains on one pool while this role
samples the next steps' rollouts on another, from its own frozen copy of the policy
(`rollout/generator_copy.py`) in the generation dtype: no gradients, no optimizer state.
After each update the controller streams the actor's weights here bucket by bucket
(`ActorWorker.open_weight_stream` / `next_weight_bucket` -> `load_weights`); each bucket goes
through Ray's object store, straight from the actor's process to this one. A Ray actor runs
its calls one at a time, so a generation always comes from one policy version, and every row
is stamped with it (`col.POLICY_VERSION`).

It samples with the actor's settings and seeds (`rollout_batch.sampling_for`): with the same
weights, the same rollout as the actor's own generator.
"""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.groups.worker import Worker
from hflow.engine.models.loading import config_and_eos, load_tokenizer, resolve_dtype
from hflow.engine.rollout.generator_copy import GeneratorCopy
from hflow.engine.rollout.vllm_copy import VLLMCopy
from hflow.engine.rollout.rollout_batch import rollout_batch, sampling_for
from hflow.engine.rollout.weight_sync import PackedBucket
from hflow.engine.specs import ActorSpec
from hflow.engine.workers.policy import create_vllm


class RolloutWorker(Worker):
    def __init__(self, spec: ActorSpec, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)
        self.spec = spec
        self.device = torch.device(device)
        self.copy: GeneratorCopy | VLLMCopy | None = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, checkpoint: str | None = None) -> None:
        """Load the policy's architecture (`checkpoint` is unused: the first `load_weights` brings
        the actor's weights, the checkpoint's when the run resumed): an hf copy, or a vLLM engine
        with `rollout.engine: vllm` (`rollout/vllm_copy.py`)."""
        m, r = self.spec.model, self.spec.rollout
        ensure_process_group(self.device, self.rank, self.world_size)
        tokenizer = load_tokenizer(m.path, m.trust_remote_code)
        dtype = resolve_dtype(m.dtype, self.device)
        if r.engine == "vllm":
            config, eos = config_and_eos(m.path, tokenizer, m.trust_remote_code)
            self.copy = VLLMCopy(create_vllm(self.spec, self.rank, self.world_size, self.device, dtype, eos,
                                             tokenizer.pad_token_id, config))
            return
        self.copy = GeneratorCopy(m.path, m.trust_remote_code, self.device, dtype, tokenizer,
                                  r.batch_size, r.weight_bucket_mb << 20)

    @register(Dispatch.ONE_TO_ALL)
    def load_weights(self, bucket: PackedBucket, version: int | None = None) -> None:
        """One bucket of the actor's weights; with `version`, the last one of that policy version."""
        self.copy.load_bucket(bucket.unpack(), version)

    @register(Dispatch.DP_COMPUTE)
    def generate(self, prompts: Batch) -> Batch:
        """The actor's `generate_async` on this pool: `rollout.n` responses per prompt, each row
        stamped with the policy version that sampled it."""
        params, n, rng = sampling_for(prompts, self.spec.rollout, self.spec.seed, self.rank, self.device)
        out, version = self.copy.generate(prompts[col.PROMPT_IDS], n, params, rng)
        out[col.POLICY_VERSION] = torch.full((len(out[col.RESPONSES]),), version, dtype=torch.long)
        return rollout_batch(prompts, out, n, self.spec.recompute_old_log_probs, self.world_size, self.copy.pad,
                             self.device)
