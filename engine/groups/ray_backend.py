"""The `ray` backend: each rank a Ray actor pinned to one device of its pool.

Colocated roles share a pool, and a pool runs one process per device (a *fused*
worker hosting every role placed there), so colocated models never pay
inter-process copies. torch.distributed spans the ranks of one pool (gloo on CPU,
NCCL on GPU).

Calls return futures (`ray_futures.Future`): per-rank Ray object refs that stay in the object
store. Passed to another group with the same number of ranks, each rank receives its
own piece straight from the store; the controller pulls data only when it reads a
column (`future["scores"]`) or the whole value (`future.get()`). Groups on different
pools therefore run at the same time, one after another only where data depends.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time
from typing import Any

import torch

from hflow.engine.kernels import product_route
from hflow.engine.kernels import build as kernels
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, Protocol
from hflow.engine.groups.dist import cuda_index, free_port, is_loopback
from hflow.engine.groups.ray_futures import Future, Part, cut, union_all, unpack
from hflow.engine.groups.ray_nodes import Node, alive_nodes, lay_out, lost_line
from hflow.engine.groups.ray_watchdog import InputFailed, get_parts, ray_module
from hflow.engine.groups.worker import ResourcePool, WorkerGroup
from hflow.errors import first_line


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


LOOPBACK = "127.0.0.1"
_RAY_MODE: dict = {}  # Ray's own `ENABLE_RAY_CLUSTER` while a local instance runs; this process's token


def start_local_ray(num_cpus: int | None = None, log_to_driver: bool = True) -> None:
    """Start a Ray instance on this machine for this process, reachable from this machine only.

    Every Ray process (GCS, raylet, agents, workers) listens on the loopback address. ray.init
    replaces a loopback `_node_ip_address` with the machine's network address
    (`services.resolve_ip_for_localhost`) unless Ray runs as a single-machine instance, its mode
    on Windows and macOS (`ray_constants.ENABLE_RAY_CLUSTER`, from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER):
    hflow selects that mode for the instance it starts, and leaves it when it stops it (`stop_local_ray`).

    Token authentication stays as Ray sets it (on for a local instance since Ray 2.59; a
    RAY_AUTH_MODE in the environment is the user's choice). Without a token in the environment
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH) this process makes one, which Ray's processes inherit and
    nothing prints, rather than Ray writing one to ~/.ray/auth_token for every later cluster (`hflow
    train` starts one instance: a token per run)."""
    ray = ray_module()
    from ray._private import ray_constants

    _RAY_MODE.setdefault("cluster", ray_constants.ENABLE_RAY_CLUSTER)
    ray_constants.ENABLE_RAY_CLUSTER = False
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        # One per process: Ray's driver keeps the first token it loads for every later instance.
        _RAY_MODE.setdefault("token", secrets.token_hex(32))  # 256 bits, as `ray get-auth-token --generate`
        os.environ["RAY_AUTH_TOKEN"] = _RAY_MODE["token"]
    # Ray's note that token authentication is on ends in how to turn it off: not hflow's advice.
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
    # address "local": a new instance even where `ray start` (or another run's cluster) left its
    # address in Ray's temp directory, which ray.init() without one would join instead.
    _init_keeping_sigterm(ray, address="local", num_cpus=num_cpus, include_dashboard=False, dashboard_host=LOOPBACK,
                          _node_ip_address=LOOPBACK, log_to_driver=log_to_driver, configure_logging=False)


def stop_local_ray() -> None:
    """Stop the instance `start_local_ray` started; Ray's own mode (several machines) comes back."""
    ray = ray_module()
    ray.shutdown()
    if "cluster" in _RAY_MODE:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = _RAY_MODE.pop("cluster")


def _joining_as(address: str) -> dict:
    """ray.init's node address for a driver joining the cluster at `address`. A head at a loopback
    address other than 127.0.0.1 (127.0.0.2: several nodes on one machine, each at its own loopback
    address) runs on this machine, and the driver joins as that node; Ray would otherwise take this
    machine's network address for the driver's and find no node there. Elsewhere Ray's own choice."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if address in ("auto", "local") or host in ("127.0.0.1", "localhost", "::1") or not is_loopback(host):
        return {}
    return {"_node_ip_address": host}


class FusedWorker:
    """The process of one device: hosts the workers of every role placed on its pool."""

    def __init__(self, rank: int, world_size: int, env: dict[str, str]):
        os.environ.update(env)
        self.rank, self.world_size = rank, world_size
        self.roles: dict[str, Any] = {}
        self.stage_seconds: dict[str, float] = {}

    def add_role(self, role: str, worker_cls: type, device: str, args: tuple, kwargs: dict) -> None:
        """Build `role`'s worker here; `device` "cuda" becomes this process's GPU, `cuda:<index>`."""
        if device == "cuda":
            device = self.cuda_device()
        self.roles[role] = worker_cls(*args, rank=self.rank, world_size=self.world_size, device=device,
                                      **kwargs)

    def cuda_device(self) -> str:
        """The GPU Ray assigned this process, made current before any role builds (DeepSpeed, NCCL
        and vLLM use the current device; `dist.cuda_index` says why the index is needed)."""
        index = cuda_index(ray_module().get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        torch.cuda.set_device(index)
        return f"cuda:{index}"

    def call(self, role: str, method: str, args: tuple, kwargs: dict, stage: str | None = None) -> Any:
        # Inputs still being computed elsewhere (a streamed chunk) are waited for here; the stage's
        # time counts from when they are in, so waiting shows as idle, not as work.
        try:
            args = tuple(unpack(a) for a in args)
            kwargs = {k: unpack(v) for k, v in kwargs.items()}
        except Exception as err:  # the call that was to produce an input raised or died
            raise InputFailed(f"{type(err).__name__}: {first_line(err)}") from None
        start = time.perf_counter()
        try:
            return getattr(self.roles[role], method)(*args, **kwargs)
        finally:
            if stage:
                self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + time.perf_counter() - start

    def pop_stage_seconds(self) -> dict[str, float]:
        """Seconds this process worked in each controller stage since the last call."""
        out, self.stage_seconds = self.stage_seconds, {}
        return out

    def identity(self) -> dict:
        """Where this process runs: its node's IP and Ray id, and its PID (plan.json records them)."""
        ray = ray_module()
        return {"node": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid()}

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port, for the pool's torch.distributed rendezvous."""
        return ray_module().util.get_node_ip_address(), free_port()

    def read(self, refs: list, keys: list[str], cuts: list) -> Batch:
        """Columns of pieces this process produced (they are local to it), each cut to its rows."""
        return union_all([cut(b.select(*keys), c) for b, c in zip(ray_module().get(refs), cuts)])

    def set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)


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
                if not direct and value.world_size == 1:  # one value for every rank, from the store
                    return [value.rank_refs(0)] * world
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

    def _inputs(self, protocol: Protocol, args: tuple, kwargs: dict) -> list[tuple]:
        """Per rank, the parts of futures its call reads from the store (as `_split` hands them)."""
        futures = [v for v in (*args, *kwargs.values()) if isinstance(v, Future)]
        direct = protocol is Dispatch.DP_COMPUTE
        return [tuple(p for f in futures for p in
                      (f.rank_parts(r) if direct and f.world_size == self.world_size else
                       f.rank_parts(0) if not direct and f.world_size == 1 else ()))
                for r in range(self.world_size)]

    def _call(self, name: str, protocol: Protocol, args: tuple, kwargs: dict) -> Any:
        inputs = self._inputs(protocol, args, kwargs)
        per_rank = self._split(protocol, args, kwargs)
        stage = self.cluster.stage
        refs = [h.call.remote(self.role, name, a, kw, stage) for h, (a, kw) in zip(self.handles, per_rank)]
        parts = [Part(ref, self.role, rank, handle, call=name, timeout_s=self.cluster.worker_timeout_s,
                      deps=inputs[rank]) for rank, (ref, handle) in enumerate(zip(refs, self.handles))]
        if protocol is Dispatch.DP_COMPUTE:
            self.cluster.in_flight.extend(parts)
            return Future([[part] for part in parts], protocol.collect)
        if protocol is Dispatch.RANK_ZERO_FUTURE:
            self.cluster.in_flight.extend(parts)
            return Future([[parts[0]]], protocol.collect)
        # Control calls (initialise, save) complete before the controller goes on.
        return protocol.collect(get_parts(parts))


class RayCluster:
    """Ray for one run: connects (or starts a local instance), places pools, spawns workers."""

    def __init__(self, address: str | None, num_cpus: int | None = None, worker_timeout_s: float | None = None):
        ray = ray_module()
        self.started = False  # a local instance this run started (and stops)
        self.joined = False  # an existing cluster this run connected to (and disconnects from)
        self.worker_timeout_s = worker_timeout_s  # the watchdog: longest wait for one worker call
        if not ray.is_initialized():
            if address:  # a cluster of several machines: its authentication is the cluster's (docs/several-machines.md)
                _init_keeping_sigterm(ray, address=address, log_to_driver=True, include_dashboard=False,
                                      **_joining_as(address))
                self.joined = True
            else:
                start_local_ray(num_cpus)
                self.started = True
        self.placement_groups = []
        self.handles: list = []
        self.planned: dict[str, list[Node]] = {}  # pool -> each rank's node (`place`)
        self.processes: dict[str, list[dict]] = {}  # pool -> each rank's {node, node_id, pid}
        self.pool_roles: dict[str, list[str]] = {}  # pool -> the roles added to it
        self.in_flight: list[Part] = []
        self.stage: str | None = None  # the controller's current stage, tagged onto each call

    def place(self, pools: list[ResourcePool], use_gpu: bool) -> dict[str, list[Node]]:
        """Decide the node of every rank of `pools` (in order) on the cluster's alive nodes
        (`ray_nodes.lay_out`); `spawn_pool` then starts each rank there."""
        ray = ray_module()
        nodes = alive_nodes(ray.nodes(), ray.get_runtime_context().get_node_id(), use_gpu)
        self.planned = lay_out([(p.name, p.world_size) for p in pools], nodes, use_gpu)
        return self.planned

    def spawn_pool(self, pool: ResourcePool, use_gpu: bool) -> list:
        """One fused worker per device of `pool`, pinned to a placement-group bundle each, on the
        node `place` chose for it (where it chose one)."""
        ray = ray_module()
        from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        nodes = self.planned.get(pool.name)
        selectors = [{NODE_ID_LABEL_KEY: node.id} for node in nodes] if nodes else None
        pg = placement_group([bundle] * pool.world_size, strategy="PACK", name=f"hflow-{pool.name}",
                             bundle_label_selector=selectors)
        ray.get(pg.ready(), timeout=120)
        self.placement_groups.append(pg)
        actor_cls = ray.remote(FusedWorker)
        # The run's choice of CPU product kernels (`product_route.settle`) and whether its compiled
        # kernels run (`kernels/build.py`), on every node.
        handles, env = [], {key: os.environ[key] for key in (product_route.ENV, kernels.ENV) if key in os.environ}
        for rank in range(pool.world_size):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=rank)
            handle = actor_cls.options(scheduling_strategy=strategy, num_cpus=1,
                                       num_gpus=1 if use_gpu else 0).remote(rank, pool.world_size, env)
            if rank == 0:
                # Rank 0's node hosts the pool's rendezvous; the others learn it at birth. On the
                # instance hflow started, the loopback address (`dist.host_loopback_store`).
                addr, port = ray.get(handle.address.remote())
                env = {**env, "MASTER_ADDR": LOOPBACK if self.started else addr, "MASTER_PORT": str(port)}
                ray.get(handle.set_env.remote(env))
            handles.append(handle)
        self.handles.extend(handles)
        self.processes[pool.name] = ray.get([h.identity.remote() for h in handles], timeout=120)
        if nodes:
            for process, node in zip(self.processes[pool.name], nodes):
                process["planned_node_id"] = node.id
        return handles

    def add_role(self, handles: list, role: str, worker_cls: type, pool: ResourcePool, *args,
                 **kwargs) -> RayWorkerGroup:
        refs = [h.add_role.remote(role, worker_cls, "cuda" if "cuda" in pool.devices[r] else "cpu", args, kwargs)
                for r, h in enumerate(handles)]
        get_parts([Part(ref, role, rank, call="init (building the worker)", timeout_s=self.worker_timeout_s)
                   for rank, ref in enumerate(refs)])
        self.pool_roles.setdefault(pool.name, []).append(role)
        return RayWorkerGroup(role, pool, worker_cls, handles, self)

    def lost_nodes(self) -> str | None:
        """One line naming the nodes that carried this run's ranks and are no longer alive, with the
        roles they carried; None while every one of them is (`ray_nodes.lost_line`)."""
        ray = ray_module()
        if not ray.is_initialized() or not self.processes:
            return None
        try:
            dead = {n["NodeID"] for n in ray.nodes() if not n.get("Alive")}
        except Exception:  # the cluster itself is gone (its head): nothing to ask
            return None
        ranks = [{**process, "pool": pool, "rank": rank, "roles": self.pool_roles.get(pool, [])}
                 for pool, processes in self.processes.items() for rank, process in enumerate(processes)]
        return lost_line(dead, ranks)

    def stage_seconds(self) -> dict[str, float]:
        """Per stage, the longest time any worker process spent in it since the last call."""
        merged: dict[str, float] = {}
        refs = [h.pop_stage_seconds.remote() for h in self.handles]
        for seconds in get_parts([Part(ref, "worker process", i, call="pop_stage_seconds",
                                       timeout_s=self.worker_timeout_s) for i, ref in enumerate(refs)]):
            for stage, value in seconds.items():
                merged[stage] = max(merged.get(stage, 0.0), value)
        return merged

    def settle(self) -> None:
        """Wait for every call in flight; a worker's failure surfaces here as a WorkerError."""
        in_flight, self.in_flight = self.in_flight, []
        get_parts(in_flight)

    def shutdown(self) -> None:
        """Stop this run's workers and free their slots; stop Ray too if this run started it."""
        ray = ray_module()
        if not ray.is_initialized():
            return
        from ray.util.placement_group import remove_placement_group

        for handle in self.handles:
            ray.kill(handle)
        for pg in self.placement_groups:
            remove_placement_group(pg)
        self.handles, self.placement_groups = [], []
        if self.started:
            stop_local_ray()
        elif self.joined:
            # The driver leaves the cluster with its run: its workers' printed lines, which Ray
            # forwards with a delay, stop here, before the run's last line.
            ray.shutdown()
