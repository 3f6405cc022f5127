"""The reference worker: the frozen initial policy, scoring responses for the KL term. Under the
actor's ZeRO-3 it is partitioned over its ranks like the actor (`training/zero3.py`)."""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine import work_meter
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.groups.worker import Worker
from hflow.engine.models.loading import load_causal_lm, resolve_dtype
from hflow.engine.specs import ReferenceSpec
from hflow.engine.training.logprobs import batched_log_probs
from hflow.engine.training.zero3 import frozen_engine, is_partitioned, partitioned_load


class ReferenceWorker(Worker):
    def __init__(self, spec: ReferenceSpec, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)
        self.spec = spec
        self.device = torch.device(device)
        self.model = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, checkpoint: str | None = None) -> None:
        """Load the frozen policy (`checkpoint` is unused: the reference never changes)."""
        m, zero = self.spec.model, self.spec.zero_stage
        dtype = resolve_dtype(m.dtype, self.device)
        if zero == 3:
            ensure_process_group(self.device, self.rank, self.world_size)
        with partitioned_load(zero, dtype):
            model = load_causal_lm(m.path, dtype, m.trust_remote_code)
        if not is_partitioned(model):
            model.to(self.device)
        model.eval().requires_grad_(False)
        work_meter.attach(model, "reference")  # what its passes compute (`work_meter.py`)
        self.model = frozen_engine(model, zero, dtype)

    @register(Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        log_probs, _ = batched_log_probs(self.model, batch.to(self.device), self.spec.temperature,
                                         self.spec.micro_batch_size, zero3=self.spec.zero_stage == 3)
        return Batch({col.REF_LOG_PROBS: log_probs.cpu()})
