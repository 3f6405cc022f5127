"""Parallel strategies of one model on a given number of devices (the paper's `auto_parallel`).

For a role on n devices this lists every strategy worth keeping: tensor x pipeline x data
parallel sizes (tp within a node), ZeRO stage, and for the actor its generation tensor-parallel
size and how many waves its rollout batch needs. Each is costed with latency.py and memory.py;
strategies that are both slower and bigger than another are dropped (Pareto front), so that a
colocated set can later trade speed for memory across its models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hflow.mapper import latency, memory
from hflow.mapper.devices import Device
from hflow.mapper.workload import Workload

STAGE_INDEX = {"generation": 0, "preparation": 1, "training": 2}


@dataclass(frozen=True)
class Setting:
    """Everything but the placement: the work, the device type and the search's options."""

    workload: Workload
    device: Device
    per_node: int  # devices per node: tensor parallelism stays inside one
    # "3d": tensor x pipeline x data parallel with ZeRO (Megatron-style, as the paper) and tensor-parallel
    # generation; "zero": data parallel with ZeRO only, everywhere (what DeepSpeed + the hf engine run).
    parallel: str = "3d"
    allow_offload: bool = False  # let trained models keep Adam states in CPU memory (ZeRO-Offload)
    train_layout: tuple[int, int] | None = None  # pin the trained models' (tp, pp), e.g. the paper's Fig. 14
    # False in async mode's training pools: a rollout pool generates, so the actor there only trains.
    actor_generates: bool = True

    @property
    def capacity(self) -> float:
        return self.device.memory * memory.USABLE_FRACTION


@dataclass(frozen=True)
class Candidate:
    """One model's strategy on n devices, its seconds per stage and its memory per stage."""

    role: str
    devices: int
    strategy: dict
    times: tuple[float, float, float]  # generation, preparation, training
    resident: tuple[float, float, float]  # bytes held on each device throughout the stage
    transient: tuple[float, float, float]  # extra bytes while this model itself runs in the stage
    detail: dict = field(default_factory=dict, compare=False)  # memory breakdown, for display

    @property
    def total(self) -> float:
        return self.times[0] + self.times[1] + self.times[2]

    def fits(self, capacity: float) -> bool:
        return all(r + t <= capacity for r, t in zip(self.resident, self.transient))


def tensor_sizes(setting: Setting, role: str, n: int) -> list[int]:
    """tp sizes: divide n and the node, split the attention heads evenly (KV heads may replicate)."""
    shape = setting.workload.models[role]
    if setting.parallel == "zero":
        return [1]
    return [t for t in range(1, min(n, setting.per_node) + 1)
            if n % t == 0 and setting.per_node % t == 0 and shape.heads % t == 0
            and (shape.kv_heads % t == 0 or t % shape.kv_heads == 0)]


def layouts(setting: Setting, role: str, n: int) -> list[tuple[int, int, int]]:
    """(tp, pp, dp) with tp * pp * dp == n; pp at most the number of layers."""
    layers = setting.workload.models[role].layers
    found = []
    for tp in tensor_sizes(setting, role, n):
        pps = [1] if setting.parallel == "zero" else range(1, min(n // tp, layers) + 1)
        found += [(tp, pp, n // (tp * pp)) for pp in pps if (n // tp) % pp == 0]
    if setting.train_layout and role in ("actor", "critic"):
        found = [layout for layout in found if layout[:2] == tuple(setting.train_layout)]
    return found


def pareto(cands: list[Candidate]) -> list[Candidate]:
    """Drop every candidate that another beats or ties on time and on every memory figure."""
    kept: list[Candidate] = []
    for cand in sorted(cands, key=lambda c: c.total):
        mem = cand.resident + cand.transient
        if not any(all(a <= b for a, b in zip(k.resident + k.transient, mem)) for k in kept):
            kept.append(cand)
    return kept


def candidates(setting: Setting, role: str, n: int) -> list[Candidate]:
    """The Pareto front of `role`'s strategies on n devices that fit a device on their own."""
    if role == "actor" and setting.actor_generates:
        found = _actor(setting, n)
    elif role == "actor":
        found = _trained(setting, role, n, with_values=False)
    elif role == "critic":
        found = _trained(setting, role, n, with_values=True)
    else:
        found = _frozen(setting, role, n)
    return pareto([c for c in found if c.fits(setting.capacity)])


def _zero_stages(setting: Setting, dp: int) -> range:
    low = setting.workload.min_zero_stage
    return range(low, low + 1) if dp == 1 else range(low, 4)


def _trained(setting: Setting, role: str, n: int, with_values: bool) -> list[Candidate]:
    """Trained models (actor's training half, critic): states, activations, update time."""
    w, dev = setting.workload, setting.device
    shape, lm_head = w.models[role], role == "actor"
    params = shape.params(lm_head)
    offloads = (False, True) if setting.allow_offload and dev.name != "cpu" else (False,)
    found = []
    for tp, pp, dp in layouts(setting, role, n):
        micro = min(w.micro_batch, math.ceil((w.mini_batch or w.sequences) / dp))
        act = memory.train_activations(shape, lm_head, micro, w.seq_len, tp, w.checkpointing, w.dtype_bytes)
        infer_act = memory.inference_activations(shape, lm_head, micro, w.seq_len, tp, w.dtype_bytes)
        for zero in _zero_stages(setting, dp):
            for offload in offloads:
                states = memory.model_states(params, w.dtype_bytes, tp, pp, dp, zero, offload)
                train_s = latency.train_time(
                    shape, lm_head, dev, setting.per_node, sequences=w.sequences, seq_len=w.seq_len,
                    steps=w.optimizer_steps, mini_batch=w.mini_batch or w.sequences, micro_batch=w.micro_batch,
                    tp=tp, pp=pp, dp=dp, zero=zero, offload=offload, checkpointing=w.checkpointing,
                    dtype_bytes=w.dtype_bytes)
                values_s = 0.0
                if with_values:
                    values_s = latency.inference_time(
                        shape, lm_head, dev, setting.per_node, sequences=w.sequences, seq_len=w.seq_len,
                        micro_batch=w.micro_batch, tp=tp, pp=pp, dp=dp, dtype_bytes=w.dtype_bytes,
                        zero3=zero >= 3)
                strategy = {"train": {"tp": tp, "pp": pp, "dp": dp, "zero_stage": zero, "offload": offload,
                                      "micro_batch": micro, "gradient_checkpointing": w.checkpointing}}
                found.append(Candidate(
                    role, n, strategy, (0.0, values_s, train_s),
                    resident=(states.total, states.total, states.total),
                    transient=(0.0, infer_act if with_values else 0.0, act),
                    detail={"weights": states.weights, "grads": states.grads, "optimizer": states.optimizer,
                            "activations": act}))
    return found


def _frozen(setting: Setting, role: str, n: int) -> list[Candidate]:
    """Inference-only models (reference, reward, cost): weights, one forward pass per iteration."""
    w, dev = setting.workload, setting.device
    shape, lm_head = w.models[role], role == "reference"
    params = shape.params(lm_head)
    found = []
    for tp, pp, dp in layouts(setting, role, n):
        micro = min(w.micro_batch, math.ceil(w.sequences / dp))
        act = memory.inference_activations(shape, lm_head, micro, w.seq_len, tp, w.dtype_bytes)
        for zero in ((0, 3) if dp > 1 else (0,)):
            weights = memory.frozen_weights(params, w.dtype_bytes, tp, pp) / (dp if zero == 3 else 1)
            seconds = latency.inference_time(
                shape, lm_head, dev, setting.per_node, sequences=w.sequences, seq_len=w.seq_len,
                micro_batch=w.micro_batch, tp=tp, pp=pp, dp=dp, dtype_bytes=w.dtype_bytes, zero3=zero == 3)
            strategy = {"infer": {"tp": tp, "pp": pp, "dp": dp, "zero_stage": zero, "micro_batch": micro}}
            found.append(Candidate(role, n, strategy, (0.0, seconds, 0.0), resident=(weights,) * 3,
                                   transient=(0.0, act, 0.0), detail={"weights": weights, "activations": act}))
    return found


def wave_counts(per_replica: int) -> list[int]:
    """Batches a generation engine may split its sequences into: 1, 2, 4, ... and one per sequence."""
    counts, w = [], 1
    while w < per_replica:
        counts.append(w)
        w *= 2
    return counts + [per_replica]


def _actor(setting: Setting, n: int) -> list[Candidate]:
    """The actor: a training strategy joined with a generation strategy (3D-HybridEngine, Section 5).

    Generation uses tp_g-way engines, n / tp_g of them; each training model-parallel group splits
    into micro-DP groups of tp*pp / tp_g engines. While generating, the hybrid engine either keeps
    the gradients and optimizer states on the device or sends them to host memory and back.
    """
    w, dev = setting.workload, setting.device
    shape = w.models["actor"]
    params = shape.params(True)
    trains = pareto([c for c in _trained(setting, "actor", n, with_values=False) if c.fits(setting.capacity)])
    found = []
    for tp_g in tensor_sizes(setting, "actor", n):
        replicas = n // tp_g
        per_replica = math.ceil(w.generated / replicas)
        gen_weights = memory.generation_weights(params, w.dtype_bytes, tp_g)
        gen_options = []
        for waves in wave_counts(per_replica):
            batch = math.ceil(per_replica / waves)
            kv = memory.kv_cache(shape, batch, w.seq_len, tp_g, w.dtype_bytes)
            seconds = latency.generation_time(shape, dev, sequences=w.generated, prompt_len=w.prompt_len,
                                              response_len=w.response_len, tp=tp_g, replicas=replicas,
                                              waves=waves, dtype_bytes=w.dtype_bytes)
            gen_options.append((waves, batch, kv, seconds))
        for train in trains:
            t = train.strategy["train"]
            zero3 = t["zero_stage"] >= 3
            shard = 1 / (t["tp"] * t["pp"] * (t["dp"] if zero3 else 1))
            span = n if zero3 else t["tp"] * t["pp"]
            weights_held = max(gen_weights, train.detail["weights"])
            state = train.detail["grads"] + train.detail["optimizer"]
            for release in ((False, True) if dev.name != "cpu" and state > 0 else (False,)):
                switch = latency.reshard_time(shape, dev, setting.per_node, train_shard=shard, gen_tp=tp_g,
                                              span=span, dtype_bytes=w.dtype_bytes,
                                              offload_state=state if release else 0.0)
                held = weights_held + (0.0 if release else state)
                for waves, batch, kv, seconds in gen_options:
                    strategy = {**train.strategy, "generate": {
                        "tp": tp_g, "micro_dp": max(1, round(t["tp"] * t["pp"] / tp_g)), "replicas": replicas,
                        "batch_per_replica": batch, "waves": waves, "release_train_state": release}}
                    found.append(Candidate(
                        "actor", n, strategy, (seconds + switch, 0.0, train.times[2]),
                        # Only the actor runs while generating, so its KV cache counts as resident there.
                        resident=(held + kv, train.resident[1], train.resident[2]),
                        transient=(0.0, 0.0, train.transient[2]),
                        detail={**train.detail, "generation_weights": gen_weights, "kv_cache": kv,
                                "reshard_s": switch}))
    return found
