"""Workers, resource pools and worker groups: the controller's handle on each role.

A Worker is ordinary SPMD code: one instance per rank, each knowing its rank and the
group's world size. A WorkerGroup is the single controller's view of all ranks of
one role: calling `group.method(batch)` applies the method's transfer protocol
(`dispatch.py`), runs every rank, and returns the gathered result, so the trainer
reads like a single-process program (HybridFlow Section 4).

Backends: `local` (here) runs the one rank inside the controller's process (a single
device; step into it with a debugger); `ray` (`ray_backend.py`) runs each rank as a
Ray actor and returns futures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from hflow.engine import work_meter
from hflow.engine.groups.dispatch import Dispatch, Protocol, protocol_of, register
from hflow.errors import RunFailed


class Worker:
    """Base of every role's worker: `rank` and `world_size` of its group."""

    def __init__(self, rank: int = 0, world_size: int = 1):
        self.rank = rank
        self.world_size = world_size

    @register(Dispatch.ONE_TO_ALL)
    def take_work(self) -> dict[str, dict[str, dict[str, int]]]:
        """What this process's models computed since the last call, per phase and model
        (`work_meter.take`), and start again from zero. The counts are the process's: colocated
        roles share it, so the first role asked gets them all and the others nothing, and the
        controller sums every group's ranks (`trainer/work/account.py`)."""
        return work_meter.take()


@dataclass
class ResourcePool:
    """A named set of devices (`cuda:0`, ..., or `cpu` worker slots) that roles are placed on."""

    name: str
    devices: list[str]

    @property
    def world_size(self) -> int:
        return len(self.devices)


class WorkerError(RunFailed):
    """A worker raised or its process died: names the role and the rank."""

    def __init__(self, role: str, rank: int, message: str):
        super().__init__(f"{role} worker rank {rank} failed: {message}")
        self.role, self.rank = role, rank


class WorkerGroup:
    """All ranks of one role on one pool, called through their methods' protocols."""

    def __init__(self, role: str, pool: ResourcePool, worker_cls: type):
        self.role = role
        self.pool = pool
        self.worker_cls = worker_cls
        self.busy_s = 0.0  # time the controller waited inside this group's calls

    @property
    def world_size(self) -> int:
        return self.pool.world_size

    def has_method(self, name: str) -> bool:
        return protocol_of(getattr(self.worker_cls, name, None)) is not None

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("_"):
            raise AttributeError(name)
        protocol = protocol_of(getattr(self.worker_cls, name, None))
        if protocol is None:
            raise AttributeError(f"{self.worker_cls.__name__}.{name} is not a registered worker method")

        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return self._call(name, protocol, args, kwargs)
            finally:
                self.busy_s += time.perf_counter() - start

        return call

    def _call(self, name: str, protocol: Protocol, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError


class LocalWorkerGroup(WorkerGroup):
    """The one rank of a role, inside the controller's process."""

    def __init__(self, role: str, pool: ResourcePool, worker_cls: type, *args: Any, **kwargs: Any):
        if pool.world_size != 1:
            raise ValueError(f"the local backend runs one rank per role, but pool {pool.name!r} has "
                             f"{pool.world_size} devices; use the ray backend")
        super().__init__(role, pool, worker_cls)
        self.worker = worker_cls(*args, rank=0, world_size=1, device=pool.devices[0], **kwargs)

    def _call(self, name: str, protocol: Protocol, args: tuple, kwargs: dict) -> Any:
        ((rank_args, rank_kwargs),) = protocol.split(args, kwargs, 1)
        return protocol.collect([getattr(self.worker, name)(*rank_args, **rank_kwargs)])


def resolve(value: Any) -> Any:
    """A worker group's result as a plain value (futures of the ray backend are waited for)."""
    get = getattr(value, "get", None)
    return get() if callable(get) and hasattr(value, "__hflow_future__") else value


def computed(value: Any, timeout_s: float) -> bool:
    """Whether a worker group's result is ready: a future of the ray backend once every piece is
    computed (waiting at most `timeout_s`, fetching nothing); a local value always."""
    return value.wait(timeout_s) if hasattr(value, "__hflow_future__") else True
