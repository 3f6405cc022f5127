"""A worker that stalls on purpose, for the watchdog test (a module on the workers' path)."""

import os
import signal

from hflow.engine.groups.dispatch import Dispatch, register
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
