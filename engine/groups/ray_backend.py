"""The `ray` backend: each rank a Ray actor pinned to one device of its pool.

Colocated roles share a pool, and a pool runs one process per device (a *fused*
worker hosting every role placed there), so colocated models never pay
inter-process copies. torch.distributed spans the ranks of one pool (gloo on CPU,
NCCL on GPU).

Calls return futures (`Future`): per-rank Ray object refs that stay in the object
store. Passed to another group with the same number of ranks, each rank receives its
own piece straight from the store; the controller pulls data only when it reads a
column (`future["scores"]`) or the whole value (`future.get()`). Groups on different
pools therefore run at the same time, one after another only where data depends.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, Protocol
from hflow.engine.groups.dist import free_port
from hflow.engine.groups.worker import ResourcePool, WorkerError, WorkerGroup
from hflow.errors import UserError


def _ray():
    # Ray's C++ failure-signal handler (absl; in the driver, and in the workers of a Ray instance
    # started from here, which inherit the variable) catches SIGTERM as well as crashes and
    # prints a C stack dump on screen. Ray's switch for it is this variable, read when ray is
    # first imported. Python's faulthandler, which Ray enables, still reports crashes, and a
    # SIGTERM reaches Python's handler: the controller stops cleanly.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    import ray

    return ray


def _init_keeping_sigterm(ray, **kwargs) -> None:
    """`ray.init`, but a SIGTERM handler the program set stays: ray.init replaces it with its own
    (`sys.exit(15)`), which would skip the program's clean stop (`hflow train`: exit 143, the run
    marked failed). A program that set none gets Ray's."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**kwargs)
    finally:
        if callable(previous) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


class _Parts:
    """One rank's share of a future: object refs whose Batches are unioned on arrival."""

    def __init__(self, refs: list):
        self.refs = refs


def _union_all(batches: list[Batch]) -> Batch:
    out = batches[0]
    for b in batches[1:]:
        out = out | b
    return out


def _unpack(value: Any) -> Any:
    if isinstance(value, _Parts):
        ray = _ray()
        return _union_all(ray.get(value.refs))
    return value


class FusedWorker:
    """The process of one device: hosts the workers of every role placed on its pool."""

    def __init__(self, rank: int, world_size: int, env: dict[str, str]):
        os.environ.update(env)
        self.rank, self.world_size = rank, world_size
        self.roles: dict[str, Any] = {}
        self.stage_seconds: dict[str, float] = {}

    def add_role(self, role: str, worker_cls: type, device: str, args: tuple, kwargs: dict) -> None:
        self.roles[role] = worker_cls(*args, rank=self.rank, world_size=self.world_size, device=device,
                                      **kwargs)

    def call(self, role: str, method: str, args: tuple, kwargs: dict, stage: str | None = None) -> Any:
        start = time.perf_counter()
        args = tuple(_unpack(a) for a in args)
        kwargs = {k: _unpack(v) for k, v in kwargs.items()}
        try:
            return getattr(self.roles[role], method)(*args, **kwargs)
        finally:
            if stage:
                self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + time.perf_counter() - start

    def pop_stage_seconds(self) -> dict[str, float]:
        """Seconds this process worked in each controller stage since the last call."""
        out, self.stage_seconds = self.stage_seconds, {}
        return out

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port, for the pool's torch.distributed rendezvous."""
        return _ray().util.get_node_ip_address(), free_port()

    def read(self, refs: list, keys: list[str]) -> Batch:
        """Columns of pieces this process produced (they are local to it)."""
        return _union_all(_ray().get(refs)).select(*keys)

    def set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)


@dataclass
class Part:
    """One piece of a rank's share: an object ref, who made it, and (for the controller's own
    pieces) the value itself, so reading it back costs nothing."""

    ref: Any
    role: str
    rank: int
    handle: Any = None  # the fused worker that produced it; None for the controller's
    local: Batch | None = None
    call: str = ""  # the worker method that produces it, for the watchdog's line
    timeout_s: float | None = None  # how long the controller waits for it (the watchdog)


def _controller_parts(batch: Batch, world: int) -> list[Part]:
    ray = _ray()
    return [Part(ray.put(piece), "controller", r, local=piece) for r, piece in enumerate(batch.chunk(world))]


class Future:
    """The pending result of a group call: per-rank parts plus how to gather them."""

    __hflow_future__ = True

    def __init__(self, parts: list[list[Part]], collect):
        self.parts = parts  # parts[rank] = the pieces whose union is that rank's share
        self.collect = collect
        self._columns: dict[str, Any] = {}
        self._value = None

    @property
    def world_size(self) -> int:
        return len(self.parts)

    def rank_refs(self, rank: int) -> _Parts:
        return _Parts([part.ref for part in self.parts[rank]])

    def get(self) -> Any:
        if self._value is None:
            per_rank = [[p.local if p.local is not None else _get_part(p) for p in rank_parts]
                        for rank_parts in self.parts]
            if isinstance(per_rank[0][0], Batch):
                self._value = Batch.concat(_union_all(p) for p in per_rank)
            else:
                self._value = self.collect([p[0] for p in per_rank])
        return self._value

    def select(self, *keys: str) -> Batch:
        """These columns as a Batch. Each worker that produced a piece reads its columns where
        the piece lives, so the rest of the batch never travels to the controller."""
        if self._value is not None:
            return self._value.select(*keys)
        missing = [k for k in keys if k not in self._columns]
        if missing:
            per_rank = []
            for rank_parts in self.parts:
                pieces = [p.local.select(*missing) for p in rank_parts if p.local is not None]
                by_handle: dict[int, list[Part]] = {}
                for p in rank_parts:
                    if p.local is None:
                        by_handle.setdefault(id(p.handle), []).append(p)
                reads = [(group, group[0].handle.read.remote([p.ref for p in group], missing))
                         for group in by_handle.values()]
                pieces += [_read(group, ref) for group, ref in reads]
                per_rank.append(_union_all(pieces))
            fetched = Batch.concat(per_rank)
            for key in fetched.keys():
                self._columns[key] = fetched[key]
        found = {k: self._columns[k] for k in keys if k in self._columns}
        return Batch({k: v for k, v in found.items() if isinstance(v, torch.Tensor)},
                     {k: v for k, v in found.items() if not isinstance(v, torch.Tensor)})

    def __getitem__(self, key: str) -> Any:
        view = self.select(key)
        if key not in view:
            raise KeyError(f"no field {key!r} in the batch")
        return view[key]

    def __contains__(self, key: str) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __len__(self) -> int:
        return len(self[col.RESPONSE_MASK]) if self._value is None else len(self._value)

    def __or__(self, other: "Future | Batch") -> "Future":
        if isinstance(other, Batch):
            extra = [[part] for part in _controller_parts(other, self.world_size)]
        elif other.world_size == self.world_size:
            extra = other.parts
        else:
            return _as_future(self.get() | other.get(), 1)
        return Future([mine + theirs for mine, theirs in zip(self.parts, extra)], self.collect)

    def __ror__(self, other: Batch) -> "Future":
        mine = _controller_parts(other, self.world_size)
        return Future([[part] + rest for part, rest in zip(mine, self.parts)], self.collect)


def _read(group: list[Part], ref) -> Batch:
    first = group[0]
    try:
        return _get(ref, first.role, first.rank, f"{first.call} (reading its result)", first.timeout_s)
    except WorkerError:
        for part in group:  # name the piece that failed, not the first of the group
            _get_part(part)
        raise


def _get_part(part: Part):
    return _get(part.ref, part.role, part.rank, part.call, part.timeout_s)


def _as_future(batch: Batch, world: int) -> Future:
    return Future([[part] for part in _controller_parts(batch, world)], Dispatch.DP_COMPUTE.collect)


def _get(ref, role: str, rank: int, call: str = "", timeout_s: float | None = None):
    """The value of one worker call. A worker that raised, died, or (the watchdog) gave no answer
    within `timeout_s` becomes a WorkerError naming its role, rank and call."""
    ray = _ray()
    died = "its process died (killed, crashed or out of memory)"
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise WorkerError(role, rank, f"no answer to {call or 'a call'} within {timeout_s:g} s "
                          "(trainer.worker_timeout_s): the process is stalled or the call hangs") from None
    except ray.exceptions.RayTaskError as err:
        cause = err.cause if getattr(err, "cause", None) is not None else err
        if isinstance(cause, ray.exceptions.RayActorError):
            raise WorkerError(role, rank, died) from None
        if isinstance(cause, UserError):  # the user's mistake, found in a worker: the same line as on local
            raise UserError(str(cause)) from None
        first_line = (str(cause).strip().splitlines() or [""])[0]
        raise WorkerError(role, rank, f"{type(cause).__name__}: {first_line}") from None
    except ray.exceptions.RayActorError:
        raise WorkerError(role, rank, died) from None


class RayWorkerGroup(WorkerGroup):
    """All ranks of a role: handles to the fused workers of its pool."""

    def __init__(self, role: str, pool: ResourcePool, worker_cls: type, handles: list, cluster: "RayCluster"):
        super().__init__(role, pool, worker_cls)
        self.handles = handles
        self.cluster = cluster

    def _split(self, protocol: Protocol, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
        world = self.world_size
        direct = protocol is Dispatch.DP_COMPUTE

        def per_rank(value):
            if isinstance(value, Future):
                if direct and value.world_size == world:
                    return [value.rank_refs(r) for r in range(world)]
                value = value.get()
            return None if isinstance(value, Batch) or not direct else [value] * world

        passthrough = {i: per_rank(a) for i, a in enumerate(args)}
        passthrough_kw = {k: per_rank(v) for k, v in kwargs.items()}
        plain_args = tuple(a.get() if isinstance(a, Future) and passthrough[i] is None else a
                           for i, a in enumerate(args))
        plain_kwargs = {k: v.get() if isinstance(v, Future) and passthrough_kw[k] is None else v
                        for k, v in kwargs.items()}
        split = protocol.split(plain_args, plain_kwargs, world)
        return [
            (tuple(passthrough[i][r] if passthrough[i] is not None else a for i, a in enumerate(a_r)),
             {k: passthrough_kw[k][r] if passthrough_kw[k] is not None else v for k, v in kw_r.items()})
            for r, (a_r, kw_r) in enumerate(split)
        ]

    def _call(self, name: str, protocol: Protocol, args: tuple, kwargs: dict) -> Any:
        per_rank = self._split(protocol, args, kwargs)
        stage = self.cluster.stage
        refs = [h.call.remote(self.role, name, a, kw, stage) for h, (a, kw) in zip(self.handles, per_rank)]
        parts = [Part(ref, self.role, rank, handle, call=name, timeout_s=self.cluster.worker_timeout_s)
                 for rank, (ref, handle) in enumerate(zip(refs, self.handles))]
        if protocol is Dispatch.DP_COMPUTE:
            self.cluster.in_flight.extend(parts)
            return Future([[part] for part in parts], protocol.collect)
        # Control calls (initialise, save) complete before the controller goes on.
        return protocol.collect([_get_part(part) for part in parts])


class RayCluster:
    """Ray for one run: connects (or starts a local instance), places pools, spawns workers."""

    def __init__(self, address: str | None, num_cpus: int | None = None, worker_timeout_s: float | None = None):
        ray = _ray()
        self.started = False
        self.worker_timeout_s = worker_timeout_s  # the watchdog: longest wait for one worker call
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            if address:
                _init_keeping_sigterm(ray, address=address, log_to_driver=True, include_dashboard=False)
            else:
                _init_keeping_sigterm(ray, num_cpus=num_cpus, include_dashboard=False, log_to_driver=True,
                                      configure_logging=False)
                self.started = True
        self.placement_groups = []
        self.handles: list = []
        self.in_flight: list[Part] = []
        self.stage: str | None = None  # the controller's current stage, tagged onto each call

    def spawn_pool(self, pool: ResourcePool, use_gpu: bool) -> list:
        """One fused worker per device of `pool`, pinned to a placement-group bundle each."""
        ray = _ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        pg = placement_group([bundle] * pool.world_size, strategy="PACK", name=f"hflow-{pool.name}")
        ray.get(pg.ready(), timeout=120)
        self.placement_groups.append(pg)
        actor_cls = ray.remote(FusedWorker)
        handles, env = [], {}
        for rank in range(pool.world_size):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=rank)
            handle = actor_cls.options(scheduling_strategy=strategy, num_cpus=1,
                                       num_gpus=1 if use_gpu else 0).remote(rank, pool.world_size, env)
            if rank == 0:
                # Rank 0's node hosts the pool's rendezvous; the others learn it at birth.
                addr, port = ray.get(handle.address.remote())
                env = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
                ray.get(handle.set_env.remote(env))
            handles.append(handle)
        self.handles.extend(handles)
        return handles

    def add_role(self, handles: list, role: str, worker_cls: type, pool: ResourcePool, *args,
                 **kwargs) -> RayWorkerGroup:
        refs = [h.add_role.remote(role, worker_cls, "cuda" if "cuda" in pool.devices[r] else "cpu", args, kwargs)
                for r, h in enumerate(handles)]
        for rank, ref in enumerate(refs):
            _get(ref, role, rank, "init (building the worker)", self.worker_timeout_s)
        return RayWorkerGroup(role, pool, worker_cls, handles, self)

    def stage_seconds(self) -> dict[str, float]:
        """Per stage, the longest time any worker process spent in it since the last call."""
        merged: dict[str, float] = {}
        refs = [h.pop_stage_seconds.remote() for h in self.handles]
        for seconds in (_get(ref, "worker process", i, "pop_stage_seconds", self.worker_timeout_s)
                        for i, ref in enumerate(refs)):
            for stage, value in seconds.items():
                merged[stage] = max(merged.get(stage, 0.0), value)
        return merged

    def settle(self) -> None:
        """Wait for every call in flight; a worker's failure surfaces here as a WorkerError."""
        in_flight, self.in_flight = self.in_flight, []
        for part in in_flight:
            _get_part(part)

    def shutdown(self) -> None:
        """Stop this run's workers and free their slots; stop Ray too if this run started it."""
        ray = _ray()
        if not ray.is_initialized():
            return
        from ray.util.placement_group import remove_placement_group

        for handle in self.handles:
            ray.kill(handle)
        for pg in self.placement_groups:
            remove_placement_group(pg)
        self.handles, self.placement_groups = [], []
        if self.started:
            ray.shutdown()
