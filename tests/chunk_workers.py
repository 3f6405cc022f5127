"""A worker that makes rollout-shaped chunks and scores them per response token, for the tests of
rows joined and cut in Ray's object store (`engine/groups/ray_futures.py`)."""

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.worker import Worker


class RowsWorker(Worker):
    def __init__(self, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def make(self, spec: Batch) -> Batch:
        """Each row of `spec` as a rollout row of the chunk's widths (P, R) = spec.meta["widths"]."""
        width_p, width_r = spec.meta["widths"]
        rows = spec["row"]
        return Batch({"row": rows, col.INPUT_IDS: rows[:, None].repeat(1, width_p + width_r),
                      col.ATTENTION_MASK: torch.ones(len(rows), width_p + width_r, dtype=torch.long),
                      col.RESPONSE_MASK: torch.ones(len(rows), width_r)})

    @register(dispatch=Dispatch.DP_COMPUTE)
    def score(self, batch: Batch) -> Batch:
        """A per-response-token column over the rows this rank received (its pieces joined)."""
        mask = batch[col.RESPONSE_MASK]
        tokens = torch.arange(mask.shape[1], dtype=torch.float32)
        return Batch({col.OLD_LOG_PROBS: (batch["row"][:, None].float() + tokens / 100) * mask})

    @register(dispatch=Dispatch.DP_COMPUTE)
    def total(self, batch: Batch) -> Batch:
        """Per row: its id, and the sum of its scored tokens, as this rank received them."""
        return Batch({"row": batch["row"], "total": (batch[col.OLD_LOG_PROBS] * batch[col.RESPONSE_MASK]).sum(-1)})
