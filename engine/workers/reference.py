"""The reference worker: the frozen initial policy, scoring responses for the KL term."""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.worker import Worker
from hflow.engine.models.loading import load_causal_lm, resolve_dtype
from hflow.engine.training.logprobs import batched_log_probs
from hflow.engine.workers.config import ReferenceSpec


class ReferenceWorker(Worker):
    def __init__(self, spec: ReferenceSpec, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)
        self.spec = spec
        self.device = torch.device(device)
        self.model = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, checkpoint: str | None = None) -> None:
        """Load the frozen policy (`checkpoint` is unused: the reference never changes)."""
        m = self.spec.model
        dtype = resolve_dtype(m.dtype, self.device)
        self.model = load_causal_lm(m.path, dtype, m.trust_remote_code).to(self.device).eval()
        self.model.requires_grad_(False)

    @register(Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        log_probs, _ = batched_log_probs(self.model, batch.to(self.device), self.spec.temperature,
                                         self.spec.micro_batch_size)
        return Batch({col.REF_LOG_PROBS: log_probs.cpu()})
