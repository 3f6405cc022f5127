"""The auto-mapper's entry point: a recipe in, a placement plan (a JSON-able dict) out.

`hflow map` prints the plan; `hflow train` calls `plan_placement` when the recipe says
`placement: {mode: auto}` and writes the result to the run directory as plan.json. The plan has
the shape of an explicit placement (`pools`, `roles`) plus what the search found and why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hflow.errors import UserError
from hflow.mapper.async_plan import AsyncPlan, AsyncResult, search_async, weight_sync
from hflow.mapper.devices import GB, Device, cpu_device, resolve_device, visible_gpus
from hflow.mapper.search import STAGES, Mapper, Plan, SearchResult
from hflow.mapper.strategy import Setting
from hflow.mapper.workload import workload_from_recipe


@dataclass(frozen=True)
class Cluster:
    device: Device
    total: int
    per_node: int
    note: str = ""  # how the device count was chosen, when not given explicitly


def resolve_cluster(recipe, gpus: int | None = None, gpus_per_node: int | None = None, gpu: str | None = None,
                    internode_gbps: float | None = None) -> Cluster:
    """Devices to plan for: arguments first, then the recipe's `cluster` section, then what is visible.

    Without a GPU count anywhere and no GPU visible, the plan covers CPU worker slots (one per core).
    """
    if gpus is not None and gpus < 0:
        raise UserError(f"--gpus {gpus}: must be 0 (detect) or a positive number of GPUs")
    if gpus_per_node is not None and gpus_per_node <= 0:
        raise UserError(f"--gpus-per-node {gpus_per_node}: must be a positive number")
    name = (gpu or recipe.cluster.gpu).lower()
    total = gpus or recipe.cluster.gpus
    if name == "cpu" or (not visible_gpus() and (not total or name == "auto")):
        slots = total or os.cpu_count() or 1
        note = ""
        if name != "cpu":
            why = "cluster.gpus is 0" if not total else "the GPU type is `auto`"
            note = (f"no GPU visible and {why}: planning {slots} CPU worker slots "
                    f"(give --gpus N --gpu TYPE to plan for GPUs)")
        # One machine's slots, unless the nodes' size is given (--gpus-per-node, or cluster.cpu_slots_per_node:
        # a Ray cluster of several machines).
        per_node = gpus_per_node or recipe.cluster.cpu_slots_per_node or slots
        return Cluster(cpu_device(slots), slots, min(slots, per_node), note)
    note = ""
    if not total:
        total = visible_gpus()
        note = f"cluster.gpus is 0: planning for the {total} visible GPU(s)"
    device = resolve_device(name, internode_gbps)
    return Cluster(device, total, gpus_per_node or recipe.cluster.gpus_per_node, note)


def search_recipe(recipe, cluster: Cluster, parallel: str = "3d", allow_offload: bool = False,
                  train_layout: tuple[int, int] | None = None) -> tuple[SearchResult, Setting]:
    """Run Algorithm 1 for `recipe` on `cluster`."""
    setting = _setting(recipe, cluster, parallel, allow_offload, train_layout)
    return Mapper(setting).search(cluster.total), setting


def _setting(recipe, cluster: Cluster, parallel: str, allow_offload: bool,
             train_layout: tuple[int, int] | None) -> Setting:
    if parallel not in ("3d", "zero"):
        raise UserError(f"parallel mode {parallel!r} is not known; accepted: 3d, zero")
    if cluster.device.name == "cpu":
        parallel = "zero"  # neither Megatron-style tensor/pipeline parallelism nor vLLM runs on CPU
    workload = workload_from_recipe(recipe, cluster.device.dtype_bytes)
    return Setting(workload, cluster.device, cluster.per_node, parallel, allow_offload, train_layout)


def plan_placement(recipe, gpus: int | None = None, *, gpus_per_node: int | None = None, gpu: str | None = None,
                   parallel: str = "3d", internode_gbps: float | None = None, allow_offload: bool = False,
                   train_layout: tuple[int, int] | None = None, top: int = 3, mode: str | None = None) -> dict:
    """The fastest placement of `recipe`'s roles, as a JSON-able dict (see docs/auto-mapper.md).

    `gpus` overrides `recipe.cluster.gpus`; with neither and no GPU visible the plan covers CPU
    worker slots. `parallel="zero"` restricts every model to ZeRO data parallelism (no tensor or
    pipeline parallelism), for engines that support nothing else. `mode` ("sync" or "async"; default
    the recipe's `trainer.mode`): "async" plans a rollout pool beside the training pools
    (async_plan.py) and adds an `async` entry. Raises UserError when no plan fits.
    """
    trainer = getattr(recipe, "trainer", None)
    mode = mode or getattr(trainer, "mode", "sync")
    if mode not in ("sync", "async"):
        raise UserError(f"trainer.mode {mode!r} is not known; accepted: sync, async")
    cluster = resolve_cluster(recipe, gpus, gpus_per_node, gpu, internode_gbps)
    if mode == "async":
        setting = _setting(recipe, cluster, parallel, allow_offload, train_layout)
        overlap = getattr(trainer, "max_staleness", 1) != 0
        return async_plan_dict(search_async(setting, cluster.total, overlap), setting, cluster, top)
    result, setting = search_recipe(recipe, cluster, parallel, allow_offload, train_layout)
    return plan_dict(result, setting, cluster, top)


def placement_name(placement: list[list[str]]) -> str:
    """The paper's names (Section 8.3) where one applies; otherwise the sets themselves."""
    if len(placement) == 1:
        return "colocate"
    if all(len(group) == 1 for group in placement):
        return "standalone"
    groups = sorted(sorted(group) for group in placement)
    if groups == [["actor"], sorted(r for g in placement for r in g if r != "actor")]:
        return "split: actor alone"
    if groups == [["actor", "reference"], ["critic", "reward"]]:
        return "split: actor+reference / critic+reward"
    return " / ".join("+".join(group) for group in placement)


def _role_entry(model, pool: str, setting: Setting) -> dict:
    seconds = dict(zip(STAGES, (round(t, 3) for t in model.times)))
    if "reshard_s" in model.detail:  # part of the actor's generation time
        seconds["reshard"] = round(model.detail["reshard_s"], 3)
    return {
        "pool": pool,
        "model": _model_name(setting, "actor" if model.role == "rollout" else model.role),
        "strategy": model.strategy,
        "seconds": seconds,
        "memory_gb": {key: round(value / GB, 4) for key, value in model.detail.items() if not key.endswith("_s")},
    }


def _model_name(setting: Setting, role: str) -> str:
    return setting.workload.names.get(role, setting.workload.models[role].name)


def _summary(plan: Plan) -> dict:
    return {
        "name": placement_name(plan.placement),
        "placement": plan.placement,
        "gpus": [s.devices for s in plan.sets],
        "estimated_iteration_s": round(plan.iteration_s, 3),
        "stage_s": dict(zip(STAGES, (round(t, 3) for t in plan.stage_s))),
    }


def _pools(sets, setting: Setting, cluster: Cluster, first: int = 0) -> tuple[list[dict], dict]:
    """Pool entries of a plan's colocated sets, and each of their roles' entries."""
    pools, roles = [], {}
    for i, plan_set in enumerate(sets, start=first):
        name = f"pool{i}"
        pools.append(_pool_entry(name, plan_set.devices, list(plan_set.roles), plan_set.peak, plan_set.times,
                                 setting, cluster))
        for model in plan_set.models:
            roles[model.role] = _role_entry(model, name, setting)
    return pools, roles


def _pool_entry(name: str, devices: int, roles: list[str], peak, times, setting: Setting, cluster: Cluster) -> dict:
    peaks = dict(zip(STAGES, (round(p / GB, 4) for p in peak)))
    return {"name": name, "devices": devices, "roles": roles,
            "memory_gb": {"capacity": round(cluster.device.memory / GB, 2), "usable": round(setting.capacity / GB, 2),
                          **peaks},
            "seconds": dict(zip(STAGES, (round(t, 3) for t in times)))}


def _common(setting: Setting, cluster: Cluster, devices_used: int, iteration_s: float) -> dict:
    w = setting.workload
    return {
        "throughput_tokens_per_s": round(w.tokens() / iteration_s, 1),
        "workload": {"algorithm": w.algorithm, "prompts": w.prompts, "responses_per_prompt": w.n,
                     "prompt_tokens": w.prompt_len, "response_tokens": w.response_len,
                     "optimizer_steps": w.optimizer_steps, "dtype_bytes": w.dtype_bytes},
        "device_spec": cluster.device.describe(),
        "device": cluster.device.name,
        "devices_total": cluster.total,
        "devices_used": devices_used,
        "gpus_per_node": cluster.per_node,
        "parallel": setting.parallel,
        "note": cluster.note,
    }


def what_hflow_runs(strategies: dict, asynchronous: bool = False) -> dict:
    """Whether `hflow train` runs these strategies as planned: its training engine is DeepSpeed ZeRO
    data parallelism and it runs frozen models whole (or ZeRO-3 partitioned), so any tensor or
    pipeline parallelism in training or inference keeps it from running the plan (`blocked_by`);
    tensor-parallel generation it runs with vLLM, which the recipe must then say (`needs`), except
    on async mode's rollout pool (tensor parallel size 1 only)."""
    blocked, needs = [], []
    for role, strategy in strategies.items():
        for kind, verb in (("train", "trains"), ("infer", "runs")):
            layout = strategy.get(kind)
            if layout and (layout["tp"] > 1 or layout["pp"] > 1):
                blocked.append(f"{role} {verb} with tensor x pipeline parallelism {layout['tp']}x{layout['pp']}")
        generate = strategy.get("generate")
        if generate and generate["tp"] > 1 and asynchronous:
            blocked.append(f"{role} generates with tensor parallelism {generate['tp']} (async mode's rollout "
                           "runs vLLM with tensor_parallel_size 1)")
        elif generate and generate["tp"] > 1:
            needs.append(f"rollout.engine: vllm with rollout.tensor_parallel_size: {generate['tp']} ({role})")
    return {"executable": not blocked, "blocked_by": blocked, "needs": sorted(set(needs))}


def plan_dict(result: SearchResult, setting: Setting, cluster: Cluster, top: int = 3) -> dict:
    best = result.best
    pools, roles = _pools(best.sets, setting, cluster)
    single = len(best.sets) == 1 and best.devices == 1
    w = setting.workload
    return {
        "backend": "local" if single else "ray",
        "pools": pools,
        "roles": {role: roles[role] for role in w.roles},
        **_summary(best),
        "strategies": {role: roles[role]["strategy"] for role in w.roles},
        "hflow_train": what_hflow_runs({role: roles[role]["strategy"] for role in w.roles}),
        **_common(setting, cluster, best.devices, best.iteration_s),
        "runners_up": [_summary(plan) for plan in result.ranked[1:1 + max(0, top)]],
        "search_s": round(result.search_s, 4),
        "candidates_evaluated": result.candidates_evaluated,
        "strategies_simulated": result.strategies_simulated,
        "placements_searched": result.placements_searched,
        "placements_fitting": len(result.ranked),
    }


def _async_summary(plan: AsyncPlan) -> dict:
    stages = (plan.generation_s, *plan.training.stage_s[1:])
    return {
        "name": f"rollout / {placement_name(plan.training.placement)}",
        "placement": plan.placement,
        "gpus": [plan.rollout.devices, *(s.devices for s in plan.training.sets)],
        "estimated_iteration_s": round(plan.step_s, 3),  # a step: max(generation, training) + weight sync
        "stage_s": dict(zip(STAGES, (round(t, 3) for t in stages))),
    }


def _async_entry(result: AsyncResult, setting: Setting) -> dict:
    best, sync = result.best, result.sync
    _, nbytes, link = weight_sync(setting, best.rollout.devices, best.training.devices)
    return {
        "generation_s": round(best.generation_s, 3),
        "training_s": round(best.training_s, 3),
        "weight_sync_s": round(best.weight_sync_s, 3),
        "weight_sync_gb": round(nbytes / GB, 4),
        "weight_sync_link": link,
        "overlap": best.overlap,
        "step_s": round(best.step_s, 3),
        "rollout_devices": best.rollout.devices,
        "training_devices": best.training.devices,
        "sync_name": placement_name(sync.placement) if sync else None,
        "sync_devices": sync.devices if sync else None,
        "sync_step_s": round(sync.iteration_s, 3) if sync else None,
        "speedup": round(sync.iteration_s / best.step_s, 3) if sync else None,
        "splits_searched": result.splits_searched,
    }


def async_plan_dict(result: AsyncResult, setting: Setting, cluster: Cluster, top: int = 3) -> dict:
    """The plan dict of an async search: a `rollout` pool first, then the training pools, and `async`."""
    best, w = result.best, setting.workload
    rollout = best.rollout
    rollout_pool = _pool_entry("rollout", rollout.devices, ["rollout"], (rollout.resident[0],) * 3,
                               rollout.times, setting, cluster)
    pools, roles = _pools(best.training.sets, setting, cluster)
    roles["rollout"] = _role_entry(rollout, "rollout", setting)
    order = ["rollout", *w.roles]
    return {
        "backend": "ray",
        "pools": [rollout_pool, *pools],
        "roles": {role: roles[role] for role in order},
        **_async_summary(best),
        "strategies": {role: roles[role]["strategy"] for role in order},
        "hflow_train": what_hflow_runs({role: roles[role]["strategy"] for role in order}, asynchronous=True),
        **_common(setting, cluster, best.devices, best.step_s),
        "async": _async_entry(result, setting),
        "runners_up": [_async_summary(plan) for plan in result.ranked[1:1 + max(0, top)]],
        "search_s": round(result.search_s, 4),
        "candidates_evaluated": result.candidates_evaluated,
        "strategies_simulated": result.strategies_simulated,
        "placements_searched": result.placements_searched,
        "placements_fitting": len(result.ranked),
    }
