"""Does a GPU recipe fit its devices as hflow runs it? `hflow validate` and the start of `hflow train`
ask (`control/preflight.py`), before any model is loaded.

`hflow map` plans tensor and pipeline parallelism that hflow's engine does not execute. This check
costs what the controller will start: the pools of `pools.pool_layout`, DeepSpeed ZeRO at each
trained section's `zero_stage` over its pool, the frozen models whole on each device (partitioned
over their pool under the actor's ZeRO-3), the recipe's generation engine, and colocated roles adding up (`hflow.mapper.executed`, with the
mapper's memory accounting). It applies only where the recipe names GPU hardware: `cluster.gpu`,
or `trainer.device: cuda` on a GPU the mapper's catalog knows. A role whose model's shape is
unknown (not in the catalog, no local config.json) counts nothing, and a CPU recipe is not checked.
"""

from __future__ import annotations

from dataclasses import replace

from hflow.errors import UserError
from hflow.mapper import memory
from hflow.mapper.devices import GB, Device, detect_gpu, resolve_device, visible_gpus
from hflow.mapper.executed import (
    GENERATOR,
    Generation,
    PoolMemory,
    PoolRun,
    RoleRun,
    executed_memory,
    pool_memory,
    role_memory,
)
from hflow.mapper.memory import USABLE_FRACTION
from hflow.mapper.search import device_counts
from hflow.mapper.workload import ROLES, STAGES, Workload, workload_from_recipe
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.step_memory import eval_decode_rows
from hflow.trainer.placement.pools import ROLLOUT, pool_layout

SECTION = {"actor": "actor", "critic": "critic", "cost_critic": "critic"}  # trained role -> its recipe section
# The largest pool a "more GPUs" hint looks for: twice the HybridFlow paper's largest cluster (128).
MOST_GPUS = 256
MAPPER_ONLY = ("this recipe is an auto-mapper example only (`hflow map` plans it with tensor and pipeline "
               "parallelism, which hflow's engine does not run)")


def check_memory(recipe: Recipe, origin: str, roles: list[str] | None = None) -> None:
    """Raise a one-line UserError naming `origin` when a pool of this GPU recipe needs more memory
    per device than the GPU it names has usable, with what would fit. `roles`: the roles the command
    starts (`hflow eval` the actor and reward only); default a training run's."""
    device = recipe_gpu(recipe, origin)
    if device is None:
        return
    workload = workload_from_recipe(recipe, device.dtype_bytes, roles=(*ROLES, "cost_critic"), known_only=True)
    if not workload.models:
        return
    capacity = device.memory * USABLE_FRACTION
    roles = roles or recipe.algorithm_spec.roles_for(recipe.uses_reference)
    runs = [role_run(recipe, role) for role in roles]
    too_big = frozen_too_big(workload, device, runs, max(1, recipe.cluster.gpus), capacity) or \
        gathered_too_big(workload, runs, capacity)
    if too_big:
        raise UserError(f"{origin}: {too_big}")
    devices = recipe.cluster.gpus or visible_gpus() or 1  # without either: the fewest a run can have
    pools = executed_pools(recipe, roles, devices, origin)
    for pool, mem in zip(pools, executed_memory(workload, device, pools)):
        if mem.worst[1] > capacity:
            fix = what_would_fit(recipe, workload, device, pool, len(pools))
            raise UserError(f"{origin}: {overflow(mem, device)}; {fix}")


def recipe_gpu(recipe: Recipe, origin: str) -> Device | None:
    """The GPU type the recipe runs on: `cluster.gpu`, else with `trainer.device: cuda` the visible
    GPU's; None where the check does not apply (a CPU run, or no GPU type to take figures from)."""
    name = recipe.cluster.gpu.lower()
    if recipe.trainer.device == "cpu" or name == "cpu":
        return None
    if name == "auto":
        if recipe.trainer.device != "cuda":
            return None
        try:
            name = detect_gpu()
        except UserError:  # a GPU the catalog does not know: no figures to check against
            return None
        if name is None:
            return None
    try:
        return resolve_device(name)
    except UserError as err:
        raise UserError(f"{origin}: cluster.gpu: {err}") from None


def executed_pools(recipe: Recipe, roles: list[str], devices: int, origin: str) -> list[PoolRun]:
    """The pools `worker_groups.build_worker_groups` starts for `roles` on `devices` GPUs, with how each
    role runs."""
    sizes, role_pool, _ = _layout(recipe, roles, devices, origin)
    backend = recipe.placement.backend
    if backend == "auto":
        backend = "local" if len(sizes) == 1 and sum(sizes.values()) == 1 else "ray"
    asynchronous = recipe.trainer.mode == "async"
    if asynchronous and backend == "ray":  # the rollout role generates on a pool of its own
        roles = [*roles, ROLLOUT]
        sizes, role_pool, _ = _layout(recipe, roles, devices, origin)
    return [PoolRun(name, size, tuple(role_run(recipe, role, asynchronous and backend == "local")
                                      for role in roles if role_pool[role] == name))
            for name, size in sizes.items()]


def _layout(recipe: Recipe, roles: list[str], devices: int, origin: str):
    try:
        return pool_layout(recipe, roles, devices, "cuda")
    except UserError as err:
        where = "placement.mode auto: " if recipe.placement.mode == "auto" else ""
        raise UserError(f"{origin}: {where}{err}") from None


def role_run(recipe: Recipe, role: str, generator_copy: bool = False) -> RoleRun:
    """How the worker of `role` runs (`worker_specs.py`): trained sections under their ZeRO stage,
    frozen models scoring in the actor's scoring micro-batches (partitioned under the actor's
    ZeRO-3), the actor generating with the rollout engine."""
    if role == ROLLOUT:
        return RoleRun(GENERATOR, generation=_generation(recipe, evaluates=False))
    if role not in SECTION:
        return RoleRun(role, zero_stage=recipe.actor.zero_stage, micro_seqs=recipe.actor.scoring_micro_batch,
                       rows=recipe.sequences_per_step)
    cfg = getattr(recipe, SECTION[role])
    seq_len = recipe.data.max_prompt_length + recipe.rollout.max_response_length
    micro = cfg.micro_batch_tokens / seq_len if cfg.micro_batch_tokens else cfg.micro_batch_size
    return RoleRun(role, trained=True, zero_stage=cfg.zero_stage, micro_seqs=micro,
                   score_seqs=cfg.scoring_micro_batch, rows=cfg.mini_batch_size or recipe.sequences_per_step,
                   lora=cfg.lora is not None,
                   generation=_generation(recipe, generator_copy) if role == "actor" else None)


def _generation(recipe: Recipe, copy: bool = False, evaluates: bool = True) -> Generation:
    """How the actor samples; `evaluates`: it also decodes the evaluations (the actor does, async
    mode's generator pool never: evaluation asks the actor)."""
    r = recipe.rollout
    return Generation(r.engine, r.batch_size, r.tensor_parallel_size, r.gpu_memory_utilization,
                      recipe.actor.offload_in_rollout, copy, evaluated=eval_decode_rows(recipe) if evaluates else 0)


def overflow(mem: PoolMemory, device: Device) -> str:
    """What does not fit: the pool, its stage at the peak, each role's share, against the usable memory."""
    stage, peak = mem.worst
    s = STAGES.index(stage)
    held = ", ".join(f"{r.role} {r.resident[s] / GB:.1f}" for r in mem.roles)
    busiest = max(mem.roles, key=lambda r: r.transient[s])
    working = f" + {busiest.transient[s] / GB:.1f} working ({busiest.role})" if busiest.transient[s] else ""
    usable = device.memory * USABLE_FRACTION
    return (f"as hflow runs it, pool {mem.name} ({', '.join(r.role for r in mem.roles)} on {mem.devices} "
            f"{device.name}) needs about {peak / GB:.1f} GB per GPU in {stage} ({held}{working} GB), "
            f"more than the {usable / GB:.1f} GB usable of {device.memory / GB:.0f} GB")


def frozen_too_big(w: Workload, device: Device, runs: list[RoleRun], devices: int, capacity: float) -> str:
    """Why no placement or GPU count helps: below the actor's ZeRO-3 frozen models are a full copy on
    every device, and these do not fit even alone. Empty when each fits."""
    needs = {}
    for run in runs:
        if run.trained or run.role == GENERATOR or run.role not in w.models:
            continue
        alone = role_memory(w, device, run, devices)
        needs[run.role] = max(r + t for r, t in zip(alone.resident, alone.transient))
    big = {role: need for role, need in needs.items() if need > capacity}
    if not big:
        return ""
    many = len(big) > 1
    return (f"as hflow runs it, the {' and '.join(big)} model{'s are' if many else ' is'} a full copy on every GPU, "
            f"about {' and '.join(f'{need / GB:.1f}' for need in big.values())} GB with working memory, more than "
            f"the {capacity / GB:.1f} GB usable of one {device.name}, so no number of GPUs holds "
            f"{'them' if many else 'it'}: {MAPPER_ONLY}")


def gathered_too_big(w: Workload, runs: list[RoleRun], capacity: float) -> str:
    """Why no placement or GPU count helps: the actor's whole weights, gathered on every GPU for a
    ZeRO-3 `hf` rollout, do not fit even alone. Empty when they do."""
    copy = _gathered_copy(w, PoolRun("actor", 1, tuple(runs)))
    if copy <= capacity:
        return ""
    return (f"as hflow runs it, {_GATHERED.format(copy=copy / GB)}, more than the {capacity / GB:.1f} GB usable "
            f"of one GPU, so no number of GPUs holds them: generate with rollout.engine: vllm and a "
            f"rollout.tensor_parallel_size above 1; as written, {MAPPER_ONLY}")


_GATHERED = "under ZeRO-3 the hf engine gathers the actor's whole weights on every GPU for the rollout ({copy:.1f} GB)"


def what_would_fit(recipe: Recipe, w: Workload, device: Device, pool: PoolRun, pools: int) -> str:
    """The smallest changes that make `pool` fit: ZeRO-3 first, then a smaller generation batch or
    more GPUs; else separate pools for the frozen models, or why none of that helps."""
    capacity = device.memory * USABLE_FRACTION

    def fits(candidate: PoolRun) -> bool:
        return pool_memory(w, device, candidate).worst[1] <= capacity

    steps = []
    # The frozen models follow the actor's stage (`worker_specs.py`): raised with it.
    actor_raised = any(r.role == "actor" for r in pool.roles) or recipe.actor.zero_stage == 3
    raised = replace(pool, roles=tuple(replace(r, zero_stage=3) if r.trained or actor_raised else r
                                       for r in pool.roles))
    if raised != pool:
        steps.append("set " + " and ".join(sorted({f"{SECTION[r.role]}.zero_stage: 3"
                                                    for r in pool.roles if r.trained and r.zero_stage < 3})))
        if fits(raised):
            return steps[0]
    options = []
    batch = _fitting_batch(raised, recipe.rollout.batch_size, fits)
    if batch:
        options.append(f"set rollout.batch_size: {batch}")
    more = [n for n in device_counts(MOST_GPUS, recipe.cluster.gpus_per_node) if n > pool.devices]
    gpus = next((n for n in more if fits(replace(raised, devices=n))), None)
    if gpus is not None:
        options.append(f"use {gpus} GPUs for pool {pool.name} ({_gpus_key(recipe, pool.name, gpus, pools)})")
    last = " or ".join(options) if options else _no_count_helps(recipe, w, raised, capacity)
    return ", then ".join([*steps, last])


def _no_count_helps(recipe: Recipe, w: Workload, pool: PoolRun, capacity: float) -> str:
    """What to change when no GPU count up to MOST_GPUS makes `pool` fit."""
    frozen = [r.role for r in pool.roles if not r.trained and r.role != GENERATOR and r.role in w.models]
    copy = _gathered_copy(w, pool)
    if frozen and len(pool.roles) > 1 and copy <= capacity / 2:
        each = "partitioned over it" if any(r.zero_stage == 3 for r in pool.roles if r.role in frozen) else \
            "each a full copy per GPU"
        return (f"put the {' and '.join(frozen)} model{'s' if len(frozen) > 1 else ''} on pools of their own "
                f"(placement.mode: explicit with placement.pools and placement.roles), {each}")
    if copy > capacity / 2:
        return (f"{_GATHERED.format(copy=copy / GB)}, and no pool of up to {MOST_GPUS} GPUs holds them beside "
                "the rest: generate "
                "with rollout.engine: vllm and a rollout.tensor_parallel_size above 1, or use a GPU with more "
                f"memory; as written, {MAPPER_ONLY}")
    knob = "rollout.gpu_memory_utilization, " if recipe.rollout.engine == "vllm" else ""
    return f"lower {knob}rollout.batch_size or the micro_batch_size, or use a GPU with more memory"


def _gathered_copy(w: Workload, pool: PoolRun) -> float:
    """Bytes of the whole weights a ZeRO-3 actor gathers for an hf rollout on this pool (0 without one)."""
    gathers = any(r.role == "actor" and r.zero_stage == 3 and r.generation is not None
                  and r.generation.engine == "hf" and not r.generation.copy for r in pool.roles)
    if not gathers or "actor" not in w.models:
        return 0.0
    return memory.generation_weights(w.models["actor"].params(True), w.dtype_bytes, 1)


def _fitting_batch(pool: PoolRun, batch: int, fits) -> int:
    """The largest rollout.batch_size below `batch` (halving) with which the pool fits; 0 if none.
    Only the hf engine's KV cache grows with it."""
    runs = [r for r in pool.roles if r.generation is not None and r.generation.engine == "hf"]
    while runs and batch > 1:
        batch //= 2
        smaller = tuple(replace(r, generation=replace(r.generation, batch=batch)) if r in runs else r
                        for r in pool.roles)
        if fits(replace(pool, roles=smaller)):
            return batch
    return 0


def _gpus_key(recipe: Recipe, pool: str, gpus: int, pools: int) -> str:
    """The recipe key that gives `pool` this many GPUs."""
    mode = recipe.placement.mode
    if mode == "explicit":
        return f"placement.pools.{pool}: {gpus}"
    if mode in ("colocate", "split", "standalone") or pools == 1:
        return f"cluster.gpus: {gpus * pools}"
    return f"cluster.gpus above {recipe.cluster.gpus or 'the visible GPUs'}"

