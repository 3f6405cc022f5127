"""Asynchronous mode (`trainer.mode: async`): a rollout pool generates while the training pools train.

The devices split into a rollout pool -- role `rollout`, a frozen copy of the actor that only
generates: its weights in the generation dtype and the KV cache, no gradients or optimizer -- and
the training side: Algorithm 1 (search.py) over the algorithm's roles on the other devices, the
actor there only training (its generation stage is gone). The two sides work at the same time,
and after each update the actor's weights go to the rollout pool, so a step costs

    step_s = max(generation_s, training_s) + weight_sync_s

With `trainer.max_staleness: 0` the generator waits for every update and nothing overlaps:
generation_s + training_s + weight_sync_s. Every split is tried (the rollout pool takes part of one
node or whole nodes, as a colocated set does in search.py); the best plan of each training
placement over all splits is kept, fastest first.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from hflow.errors import UserError
from hflow.mapper import latency, memory
from hflow.mapper.search import Mapper, Plan, device_counts
from hflow.mapper.strategy import Candidate, Setting, pareto, tensor_sizes, wave_counts

# CPU worker slots exchange weights through host memory: a copy reads and writes every byte, so it
# runs at half the memory bandwidth (the CPU entry's 10 GB/s, devices.cpu_device): 5 GB/s.
CPU_COPY_FRACTION = 0.5


@dataclass(frozen=True)
class AsyncPlan:
    rollout: Candidate  # the rollout pool's generation strategy, on rollout.devices devices
    training: Plan  # the training roles' placement on the other devices
    weight_sync_s: float
    link: str  # what the weights travel over: intra-node, inter-node or memory copy
    overlap: bool = True  # False with max_staleness 0: generation waits for the update

    @property
    def generation_s(self) -> float:
        return self.rollout.times[0]

    @property
    def training_s(self) -> float:
        return self.training.iteration_s

    @property
    def step_s(self) -> float:
        if self.overlap:
            return max(self.generation_s, self.training_s) + self.weight_sync_s
        return self.generation_s + self.training_s + self.weight_sync_s

    @property
    def devices(self) -> int:
        return self.rollout.devices + self.training.devices

    @property
    def placement(self) -> list[list[str]]:
        return [["rollout"], *self.training.placement]


@dataclass
class AsyncResult:
    best: AsyncPlan
    ranked: list[AsyncPlan]  # the best plan of each training placement over every split, fastest first
    sync: Plan | None  # the best synchronous plan on all the devices (None when none fits)
    search_s: float
    candidates_evaluated: int
    strategies_simulated: int
    placements_searched: int  # partitions of the training roles
    splits_searched: int  # rollout pool sizes tried


def rollout_candidates(setting: Setting, n: int) -> list[Candidate]:
    """Generation-only strategies of the actor's copy on n devices that fit, fastest first.

    tp_g-way engines, n / tp_g of them, each decoding its share in 1, 2, 4, ... waves; a device
    holds 1/tp_g of the weights in the generation dtype and its engine's KV cache.
    """
    w, dev = setting.workload, setting.device
    shape = w.models["actor"]
    found = []
    for tp_g in tensor_sizes(setting, "actor", n):
        replicas = n // tp_g
        per_replica = math.ceil(w.generated / replicas)
        weights = memory.generation_weights(shape.params(True), w.dtype_bytes, tp_g)
        for waves in wave_counts(per_replica):
            batch = math.ceil(per_replica / waves)
            kv = memory.kv_cache(shape, batch, w.seq_len, tp_g, w.dtype_bytes)
            seconds = latency.generation_time(shape, dev, sequences=w.generated, prompt_len=w.prompt_len,
                                              response_len=w.response_len, tp=tp_g, replicas=replicas,
                                              waves=waves, dtype_bytes=w.dtype_bytes)
            strategy = {"generate": {"tp": tp_g, "replicas": replicas, "batch_per_replica": batch, "waves": waves}}
            found.append(Candidate("rollout", n, strategy, (seconds, 0.0, 0.0), resident=(weights + kv,) * 3,
                                   transient=(0.0, 0.0, 0.0), detail={"generation_weights": weights, "kv_cache": kv}))
    return pareto([c for c in found if c.fits(setting.capacity)])


def weight_sync(setting: Setting, rollout_devices: int, training_devices: int) -> tuple[float, float, str]:
    """(seconds, bytes, link) to send the actor's weights, in the generation dtype, to the rollout pool.

    Over NVLink (the device's intra-node bandwidth) when both pools fit in one node, else over the
    network (the node's inter-node bandwidth); between CPU slots, a memory copy.
    """
    nbytes = setting.workload.models["actor"].params(True) * setting.workload.dtype_bytes
    dev = setting.device
    if dev.name == "cpu":
        bandwidth, link = dev.hbm_bw * CPU_COPY_FRACTION, "memory copy"
    elif rollout_devices + training_devices <= setting.per_node:
        bandwidth, link = dev.intra_bw, "intra-node"
    else:
        bandwidth, link = dev.inter_bw, "inter-node"
    return nbytes / bandwidth, nbytes, link


def _rank(plan: AsyncPlan) -> tuple:
    return round(plan.step_s, 9), plan.devices, len(plan.training.sets)


def search_async(setting: Setting, total: int, overlap: bool = True) -> AsyncResult:
    """Every split of `total` devices into a rollout pool and the training side; the fastest plans."""
    if total < 2:
        raise UserError(f"trainer.mode async plans a rollout pool beside the training pool(s): it needs at least "
                        f"2 devices, this plan has {total} (give --gpus 2 or more, or set trainer.mode: sync)")
    start = time.perf_counter()
    trainer = Mapper(replace(setting, actor_generates=False))
    best: dict[tuple, AsyncPlan] = {}
    evaluated = simulated = placements = splits = 0
    why = ""  # why the training roles do not fit beside the smallest rollout pool, if they do not
    for r in [n for n in device_counts(total - 1, setting.per_node) if n < total]:
        splits += 1
        rollouts = rollout_candidates(setting, r)
        simulated += len(rollouts)
        if not rollouts:  # the actor's copy does not fit r devices
            continue
        try:
            training = trainer.search(total - r)
        except UserError as err:  # the training roles do not fit on what is left
            why = why or f"; beside a {r}-device rollout pool, {err}"
            continue
        evaluated += training.candidates_evaluated
        placements = training.placements_searched
        for plan in training.ranked:
            seconds, _, link = weight_sync(setting, r, plan.devices)
            found = AsyncPlan(rollouts[0], plan, seconds, link, overlap)
            key = tuple(map(tuple, plan.placement))
            if key not in best or _rank(found) < _rank(best[key]):
                best[key] = found
    if not best:
        raise UserError(f"trainer.mode async: no plan fits memory in {total} {setting.device.name} device(s) with "
                        f"the rollout pool and the training roles side by side{why or ' (add devices)'}")
    ranked = sorted(best.values(), key=_rank)
    try:
        sync = Mapper(setting).search(total).best
    except UserError:
        sync = None
    return AsyncResult(ranked[0], ranked, sync, time.perf_counter() - start, evaluated,
                       simulated + trainer.strategies_simulated, placements, splits)
