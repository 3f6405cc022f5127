"""Memory per device of the strategy hflow executes, which is not the one `hflow map` searches.

The search plans Megatron-style tensor x pipeline x data parallelism for every model
(strategy.py). hflow's own engine runs less (trainer/placement/worker_groups.py and worker_specs.py,
engine/workers/, engine/training/train_engine.py, engine/rollout/hybrid.py):

- trained roles (actor, critics): DeepSpeed ZeRO data parallelism over their pool's devices at
  the recipe's stage; no tensor or pipeline parallelism. With bf16 weights, ZeRO-1/2 accumulate
  gradients in fp32 (`train_engine.deepspeed_config`): 4 bytes per gradient, not 2;
- frozen roles (reference, reward and cost models): a full copy of the weights on every device,
  or under the actor's ZeRO-3 a partition of them (training/zero3.py), gathered a window at a time;
- generation with `hf` below ZeRO-3: on the training module itself (no second copy), plus the KV
  cache of the sequences a device decodes at once. Under ZeRO-3 the whole weights are gathered
  once into a generation copy for the rollout (rollout/gathered_generator.py) and freed after it.
  With `vllm`: its own copy (1/tensor_parallel_size of the weights) and KV cache within its
  `gpu_memory_utilization` share of the device. A generator with weights of its own first sends
  the part of the training state DeepSpeed can offload to host memory, where it stays until the
  update (hybrid.PhaseSwitch: rollout, scoring, training);
- the LM head (the actor's, the reference's) runs only where a token is scored: a row's response
  and its prompt's last position (engine/lm_head.py `head_at`, or `logits_to_keep`), so a pass
  holds the logits of response_len + 1 positions a sequence, not of the whole sequence (`scored`);
- a ZeRO-3 forward or backward gathers a window of parameters at a time (`memory.zero3_gathered`);
- roles on one pool add up on a device (`memory.colocated_peak`, as the search counts a set).

`executed_memory(workload, device, pools)` gives the bytes per device of each pool and role,
with memory.py's accounting; `hflow validate` and `hflow train` compare them with the device's
usable memory before a run starts (trainer/placement/memory_check.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hflow.mapper import memory
from hflow.mapper.devices import Device
from hflow.mapper.workload import STAGES, Workload

GENERATOR = "rollout"  # async mode's generation-only copy of the actor, on a pool of its own


@dataclass(frozen=True)
class Generation:
    """How the actor (or async mode's generator) samples on each of its devices."""

    engine: str  # "hf" or "vllm"
    batch: int  # most sequences decoded at once (rollout.batch_size)
    tp: int = 1  # vllm: devices per generation replica
    share: float = 0.0  # vllm: the fraction of device memory it holds (gpu_memory_utilization)
    offload: bool = False  # actor.offload_in_rollout (vLLM and ZeRO-3's gathered copy offload anyway)
    copy: bool = False  # async mode on the local backend: a second frozen copy generates beside training
    # Sequences an evaluation decodes at once on one device, as rows of the step's length holding as
    # much KV cache (eval.batch_size at its lengths); 0: none, or fewer than the step's.
    evaluated: int = 0


@dataclass(frozen=True)
class RoleRun:
    """How hflow runs one role on its pool."""

    role: str  # actor, critic, cost_critic, reference, reward, cost, or GENERATOR
    trained: bool = False
    zero_stage: int = 0
    micro_seqs: float = 1.0  # sequences per forward/backward pass (fractional: a token budget)
    score_seqs: float = 0.0  # sequences per scoring forward, without a backward (0: micro_seqs)
    rows: int = 1  # sequences one pass over the role spreads across its pool (a mini-batch, a step)
    lora: bool = False  # only adapters train: their gradients and Adam states are negligible
    generation: Generation | None = None


@dataclass(frozen=True)
class PoolRun:
    name: str
    devices: int
    roles: tuple[RoleRun, ...]


@dataclass(frozen=True)
class RoleMemory:
    role: str
    resident: tuple[float, float, float]  # bytes held on each device through each stage
    transient: tuple[float, float, float]  # extra bytes while the role itself runs in the stage
    detail: dict = field(default_factory=dict)  # what the bytes are, for messages


@dataclass(frozen=True)
class PoolMemory:
    name: str
    devices: int
    roles: tuple[RoleMemory, ...]
    peak: tuple[float, float, float]  # bytes per device in each stage (generation, preparation, training)

    @property
    def worst(self) -> tuple[str, float]:
        """The stage with the highest peak, and that peak."""
        stage = max(range(3), key=lambda s: self.peak[s])
        return STAGES[stage], self.peak[stage]


def executed_memory(workload: Workload, device: Device, pools: list[PoolRun]) -> list[PoolMemory]:
    """Bytes per device of every pool, as hflow runs its roles. Roles whose model's shape the
    workload lacks (unknown models, reward functions) count nothing."""
    return [pool_memory(workload, device, pool) for pool in pools]


def pool_memory(workload: Workload, device: Device, pool: PoolRun) -> PoolMemory:
    roles = tuple(role_memory(workload, device, run, pool.devices) for run in pool.roles
                  if shape_role(run.role) in workload.models)
    peak = memory.colocated_peak([r.resident for r in roles], [r.transient for r in roles])
    return PoolMemory(pool.name, pool.devices, roles, peak)


def shape_role(role: str) -> str:
    """The role whose model `role` runs: the generator runs the actor's."""
    return "actor" if role == GENERATOR else role


def role_memory(workload: Workload, device: Device, run: RoleRun, devices: int) -> RoleMemory:
    """One role's bytes per device on a pool of `devices`."""
    if run.role == GENERATOR:
        held = _generator_bytes(workload, device, run.generation, devices)
        return RoleMemory(run.role, (held, held, held), (0.0, 0.0, 0.0), {"generation": held})
    if run.trained:
        return _trained(workload, device, run, devices)
    shape = workload.models[run.role]
    params = shape.params(run.role == "reference")
    weights = memory.frozen_weights(params, workload.dtype_bytes, 1, 1)
    forward = memory.inference_activations(shape, run.role == "reference", _micro(run, devices, scoring=True),
                                           workload.seq_len, 1, workload.dtype_bytes, scored(workload))
    if run.zero_stage == 3:  # partitioned like the actor: a share resident, a window gathered per pass
        weights /= devices
        forward += memory.zero3_gathered(params, workload.dtype_bytes)
    return RoleMemory(run.role, (weights,) * 3, (0.0, forward, 0.0), {"weights": weights, "activations": forward})


def scored(workload: Workload) -> int:
    """Positions a sequence whose logits a scoring or training pass computes: its response's, and
    its prompt's last (which predicts the response's first token)."""
    return workload.response_len + 1


def _micro(run: RoleRun, devices: int, scoring: bool = False) -> float:
    seqs = (run.score_seqs or run.micro_seqs) if scoring else run.micro_seqs
    return min(seqs, math.ceil(run.rows / devices))


def _trained(w: Workload, device: Device, run: RoleRun, dp: int) -> RoleMemory:
    """The actor or a critic under ZeRO over `dp` devices; the actor also generates."""
    shape, lm_head = w.models[run.role], run.role == "actor"
    params = shape.params(lm_head)
    bf16 = w.dtype_bytes == 2
    grad_bytes = 4 if bf16 and run.zero_stage in (1, 2) else w.dtype_bytes
    states = memory.model_states(params, w.dtype_bytes, 1, 1, dp, run.zero_stage, grad_bytes=grad_bytes)
    if run.lora:
        states = replace(states, grads=0.0, optimizer=0.0)
    gathered = memory.zero3_gathered(params, w.dtype_bytes) if run.zero_stage == 3 else 0.0
    forward = memory.inference_activations(shape, lm_head, _micro(run, dp, scoring=True), w.seq_len, 1,
                                           w.dtype_bytes, scored(w)) + gathered
    train = memory.train_activations(shape, lm_head, _micro(run, dp), w.seq_len, 1, w.checkpointing,
                                     w.dtype_bytes, scored(w)) + gathered
    detail = {"weights": states.weights, "grads": states.grads, "optimizer": states.optimizer, "activations": train}
    held, gen = states.total, run.generation
    if gen is None:
        return RoleMemory(run.role, (held,) * 3, (0.0, forward, train), detail)
    if gen.copy:  # the copy generates while the module trains: it is there in every stage
        copy = _generator_bytes(w, device, replace(gen, engine="hf"), dp)
        return RoleMemory(run.role, (held + copy,) * 3, (0.0, forward, train), {**detail, "generator_copy": copy})
    # A generator with weights of its own (vLLM, or ZeRO-3's gathered copy) always sends the training
    # state it can to host memory first; it stays there while the step is scored, until the update.
    own_weights = gen.engine == "vllm" or run.zero_stage == 3
    kept = kept_while_generating(states, run.zero_stage, bf16, gen.offload or own_weights)
    if own_weights:
        generator = _generator_bytes(w, device, gen, dp)
    else:  # generates on the training module itself
        generator = memory.kv_cache(shape, _decoded(w, gen, dp), w.seq_len, 1, w.dtype_bytes)
    generating = kept + generator
    return RoleMemory(run.role, (generating, kept, held), (0.0, forward, train),
                      {**detail, "generator": generator, "kept_while_generating": kept})


def kept_while_generating(states: memory.ModelStates, zero: int, bf16: bool, offload: bool) -> float:
    """What the training state leaves on the device while the actor generates with `offload`
    (`TrainEngine.offload_states`, DeepSpeed 0.19): ZeRO-2 moves its optimizer states, fp32
    master weights and gradients to host memory, and so does ZeRO-1 in fp32; ZeRO-3 moves only
    its gradients (its optimizer offload needs DeepSpeed's FusedAdam; hflow runs torch's AdamW);
    stage 0 and bf16 ZeRO-1 (DeepSpeed's BF16_Optimizer) move nothing. The weights stay."""
    if not offload or zero == 0 or (zero == 1 and bf16):
        return states.total
    if zero == 3:
        return states.weights + states.optimizer
    return states.weights


def _decoded(w: Workload, gen: Generation, devices: int) -> int:
    """Sequences one device decodes at once: its share of the step's, at most the engine's batch, or
    an evaluation's batch where that holds more."""
    return max(min(gen.batch, math.ceil(w.generated / devices)), gen.evaluated)


def _vllm_bytes(w: Workload, device: Device, gen: Generation) -> float:
    """vLLM holds its share of the device; more where its weights and one sequence's KV cache do
    not fit in that share (it would refuse to start)."""
    shape = w.models["actor"]
    weights = memory.generation_weights(shape.params(True), w.dtype_bytes, gen.tp)
    return max(gen.share * device.memory, weights + memory.kv_cache(shape, 1, w.seq_len, gen.tp, w.dtype_bytes))


def _generator_bytes(w: Workload, device: Device, gen: Generation, devices: int) -> float:
    """A generator with the actor's weights of its own: a whole copy in the generation dtype and its
    KV cache (hf: async mode's copy, or the gathered weights of a ZeRO-3 actor), or vLLM's share."""
    if gen.engine == "vllm":
        return _vllm_bytes(w, device, gen)
    shape = w.models["actor"]
    weights = memory.generation_weights(shape.params(True), w.dtype_bytes, 1)
    return weights + memory.kv_cache(shape, _decoded(w, gen, devices), w.seq_len, 1, w.dtype_bytes)
