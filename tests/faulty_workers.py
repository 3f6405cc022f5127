"""Workers that stall, hang or fail on purpose, for the watchdog tests (a module on the workers' path)."""

import os
import signal
import time

import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.groups.worker import Worker


class StallingWorker(Worker):
    def __init__(self, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)

    @register(dispatch=Dispatch.RANK_ZERO)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch=Dispatch.RANK_ZERO)
    def stall(self) -> None:
        """Stop this whole process (SIGSTOP), as a hung driver or a stopped machine would."""
        os.kill(os.getpid(), signal.SIGSTOP)


class HangingWorker(Worker):
    """`hang` never answers, as a hung reward function; `read` returns what it is given, so a
    call of it over `hang`'s result waits for `hang` (the actor reading the reward's scores)."""

    def __init__(self, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def hang(self, batch: Batch) -> Batch:
        time.sleep(3600)
        return batch

    @register(dispatch=Dispatch.DP_COMPUTE)
    def read(self, batch: Batch) -> Batch:
        return batch


class GivingUpRankWorker(Worker):
    """Rank 1 raises while rank 0 waits for it in a collective (a barrier) that never completes."""

    def __init__(self, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def join_group(self) -> None:
        ensure_process_group(torch.device("cpu"), self.rank, self.world_size)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def barrier_or_raise(self) -> None:
        if self.rank == 1:
            raise ValueError("rank 1 gave up")
        torch.distributed.barrier()
