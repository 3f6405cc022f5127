"""The DeepSpeed ZeRO training engine of a trained role (the actor; later the critics).

One object owns the DeepSpeed engine, its AdamW optimizer and LR schedule, and saves
and restores them without pickles: weights and Adam moments as safetensors, the
rest as JSON. Per-parameter full states come from DeepSpeed's tensor-fragment API,
so the same checkpoint serves every ZeRO stage and data-parallel size.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import sys
from pathlib import Path

import torch

from hflow.engine.specs import OptimSpec
from hflow.engine.training.master_state import MOMENTS, MasterState
from hflow.engine.training.saved_weights import WEIGHTS_FILE
from hflow.engine.training.tensor_file import TensorFileWriter, TensorSpec


def lr_lambda(cfg: OptimSpec, total_steps: int):
    """LR multiplier per optimizer step: linear warm-up, then constant, linear or cosine decay."""

    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        if cfg.lr_schedule == "linear":
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay

    return factor


def clips_itself(zero_stage: int, bf16: bool) -> bool:
    """Whether the engine clips the gradients itself: without ZeRO in float32. There DeepSpeed clips
    after a norm parameter by parameter, an all-reduce of it and a multiply of every gradient even
    when nothing is clipped, and reports no norm; the engine measures the norm once (one fused
    kernel), which it reports, and multiplies only when it clips: SmolLM2-135M's optimizer step took
    75-80 ms against 97-118 (`benchmarks/clip_step.py`, docs/benchmarks.md). Every other
    DeepSpeed optimizer (ZeRO's, and bf16's wrappers without ZeRO) clips after a norm it reports."""
    return zero_stage == 0 and not bf16


def deepspeed_config(zero_stage: int, grad_clip: float, micro_batch_size: int, micro_steps: int,
                     bf16: bool) -> dict:
    """DeepSpeed's configuration for a trained role.

    With bf16 weights under ZeRO-1/2, gradients are accumulated over micro-batches (and reduced
    over ranks) in fp32: summed in bf16, with its 8-bit mantissa, the later micro-batches'
    contributions round away (DeepSpeed warns of it; OpenRLHF sets the same). ZeRO-1 then runs
    DeepSpeed's BF16_Optimizer, ZeRO-2 its ZeRO optimizer with an fp32 accumulation buffer.
    ZeRO-0 cannot (DeepSpeed refuses bf16 weights with fp32 accumulation without ZeRO) and
    ZeRO-3 keeps DeepSpeed's default.

    BF16_Optimizer moves each parameter's gradient into its fp32 buffer as soon as the backward
    has written it (`immediate_grad_update`), not after the backward: DeepSpeed clears the bf16
    gradients each time the backward first reaches a forward's outputs, so with several forwards
    before one backward (a shared prompt, then its length buckets) a gradient written before an
    earlier forward's outputs were reached (a module run once over several forwards' outputs, as
    the LM head was in a trial) was lost (tested). It also frees each bf16 gradient as it lands.
    """
    config = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": micro_steps,
        "gradient_clipping": 0.0 if clips_itself(zero_stage, bf16) else grad_clip,
        "zero_optimization": {"stage": zero_stage},
        "bf16": {"enabled": bf16, "immediate_grad_update": True},  # read by BF16_Optimizer alone
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if bf16 and zero_stage in (1, 2):
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    return config


def stage_worth_running(cfg: OptimSpec, world_size: int, device: torch.device, bf16: bool) -> OptimSpec:
    """`cfg` with ZeRO-1/2 run as ZeRO-0 where they would only copy: one rank on the CPU with fp32
    weights. ZeRO shards the optimizer's state over data-parallel ranks; alone there is nothing to
    shard, and DeepSpeed's ZeRO-1/2 optimizer still keeps an fp32 master copy of the (already fp32)
    weights and a flat fp32 copy of the gradients at every step: on SmolLM2-135M 513 MiB held for
    the whole run and 513 MiB more during each optimizer step, for the same AdamW update. On a GPU
    ZeRO-2 is what moves the training state off the device during the rollout (`offload_states`),
    and bf16 weights need the fp32 master: those keep the recipe's stage."""
    if cfg.zero_stage in (1, 2) and world_size == 1 and device.type == "cpu" and not bf16:
        return dataclasses.replace(cfg, zero_stage=0)
    return cfg


MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def import_muon_uncompiled() -> None:
    """DeepSpeed's ZeRO code imports its Muon optimizer at set-up and in its gradient reduction;
    that module decorates its kernels with `torch.compile` at import, which loads torch's compiler
    (`torch._inductor`): 1.5-3 s of every training process's start on a 2-core machine, for an
    optimizer hflow never builds (it gives DeepSpeed torch's AdamW). Imported here first with
    torch's default compile backend set to eager for the import alone, the module loads without
    the compiler; its kernels would run uncompiled, and nothing here runs them."""
    if MUON_MODULE in sys.modules or not hasattr(torch.compiler, "set_default_backend"):
        return
    before = torch.compiler.get_default_backend()
    torch.compiler.set_default_backend("eager")
    try:
        importlib.import_module(MUON_MODULE)
    except ImportError:  # a DeepSpeed without Muon: nothing to import
        pass
    finally:
        torch.compiler.set_default_backend(before)


class TrainEngine:
    """DeepSpeed-wrapped model + AdamW + schedule; `micro_steps` micro-batches per update."""

    def __init__(self, model: torch.nn.Module, cfg: OptimSpec, total_updates: int,
                 micro_batch_size: int, micro_steps: int, bf16: bool):
        import deepspeed

        import_muon_uncompiled()

        self.cfg = cfg
        self.clips = clips_itself(cfg.zero_stage, bf16)
        # fused: one kernel over all the parameters (torch's CPU and CUDA AdamW alike); on the CPU
        # torch's default steps parameter by parameter, measured 4.3x slower on SmolLM2-135M.
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_updates))
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler,
            config=deepspeed_config(cfg.zero_stage, cfg.grad_clip, micro_batch_size, micro_steps, bf16),
        )
        if cfg.zero_stage == 0 and self.engine.dp_world_size == 1:
            # Alone, DeepSpeed would still copy every gradient into flat buckets, all-reduce them over
            # the one rank and copy them back at each boundary (0.3-0.5 s of a 7 s SmolLM2 update).
            self.engine.enable_backward_allreduce = False
        self.master = MasterState(self.optimizer)
        if self.engine.device.type == "cpu" and cfg.zero_stage == 0 and not bf16:
            # Adam's moments now, not at the first step: there they took the heap's memory the first
            # update's activations had just freed, so the second update's came from new pages, and the
            # heap grew for three steps, not two (SmolLM2-135M: 358,000 and 145,000 pages faulted in by
            # the second and third updates, 4.9 and 1.9 s in the kernel, against 212,000 and none;
            # the same zeros torch would create; docs/benchmarks.md, "Moments before the first update").
            self.master.create_moments()
        self.updates = 0

    @classmethod
    def for_role(cls, model: torch.nn.Module, cfg: OptimSpec, world_size: int, device: torch.device,
                 dtype: torch.dtype) -> "TrainEngine":
        """The engine of a trained role (actor, critic) of `world_size` data-parallel ranks: each
        rank's share of the mini-batch in micro-batches of `cfg.micro_batch_size`, at the ZeRO stage
        worth running there (`stage_worth_running`)."""
        bf16 = dtype == torch.bfloat16
        local_mini = cfg.mini_batch_size // world_size
        return cls(model, stage_worth_running(cfg, world_size, device, bf16), cfg.total_updates,
                   cfg.micro_batch_size, micro_steps=max(1, local_mini // cfg.micro_batch_size), bf16=bf16)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def forward(self, **inputs):
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        # The loss arrives already normalised over the whole mini-batch (token-mean across
        # micro-batches and ranks), so DeepSpeed must not divide it by the accumulation steps.
        self.engine.backward(loss, scale_wrt_gas=False)

    def set_boundary(self, is_boundary: bool) -> None:
        """Whether the next micro-batch ends the accumulation (micro-batch counts may vary)."""
        self.engine.set_gradient_accumulation_boundary(is_boundary)

    def step(self) -> float | None:
        """Advance one micro-batch; at the accumulation boundary, update and return the grad norm."""
        boundary = self.engine.is_gradient_accumulation_boundary()
        norm = self._clip() if boundary and self.clips else None
        self.engine.step()
        if not boundary:
            return None
        self.updates += 1
        if norm is None:
            norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def _clip(self) -> torch.Tensor:
        """The gradients' global norm, and the gradients scaled by grad_clip / (norm + 1e-6) where
        that is below 1, as DeepSpeed would (`clips_itself`). Every rank holds the all-reduced
        gradients at the boundary: the norm is the same on each."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if float(norm) + 1e-6 > self.cfg.grad_clip:  # else the factor is 1: no multiply
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.grad_clip, norm)
        return norm

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    # --- rollout: give the GPU memory of the training state to the generation engine ----------

    def offload_states(self) -> list[str]:
        """Move what training alone needs to CPU memory (GPU only); returns what was moved.

        DeepSpeed 0.19.8's `engine.offload_states` (runtime/engine.py) supports ZeRO-1/2
        (stage_1_and_2.py: any torch optimizer's states, the fp32 master partitions, the gradient
        partitions) and ZeRO-3 (stage3.py: gradients and the gradient bucket; its optimizer-state
        and master-weight offload asserts DeepSpeed's own FusedAdam, while hflow builds torch's
        AdamW so that the same engine runs on CPU). Stage 0 and ZeRO-1 with bf16 weights (DeepSpeed's
        BF16_Optimizer, chosen for fp32 gradient accumulation: `deepspeed_config`) have no
        `offload_states` and keep their states on the GPU: ZeRO-2 is the stage that offloads.
        The bf16 weights stay on the GPU in every stage: the weight sync reads them.
        """
        return self.move_states() if self.engine.device.type == "cuda" else []

    def reload_states(self) -> None:
        """Undo `offload_states` (a no-op when nothing was moved)."""
        if self.engine.device.type == "cuda":
            self.restore_states()

    def move_states(self) -> list[str]:
        """`offload_states` on any device (on the CPU the tensors stay where they are, but
        DeepSpeed's bookkeeping runs as on a GPU: how the offload -> reload -> save cycle is
        tested without one)."""
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as State

        if self.cfg.zero_stage == 0 or not hasattr(self.engine.optimizer, "offload_states"):
            return []
        if self.cfg.zero_stage == 3:
            include = [State.lp_grads, State.contiguous_grad_buffer]
        else:
            include = [State.optim_states, State.hp_params, State.lp_grads]
        self.engine.offload_states(include=include)
        self._moved = True
        return [state.value for state in include]

    def restore_states(self) -> None:
        if not getattr(self, "_moved", False):
            return
        self.engine.reload_states()
        self._moved = False
        # The reload replaced the moment tensors and, for the master weights, rebuilt each
        # parameter's fragment mapping without its moments (`MasterState.relink_moments`).
        self.master.relink_moments()

    # --- checkpoints -----------------------------------------------------------------
    # Streamed tensor by tensor: each full fp32 tensor is gathered (a collective under ZeRO,
    # every rank in the same order), written by rank 0 and dropped, so no rank holds more of a
    # checkpoint than one tensor (with `save_file` every rank built the whole fp32 state, about
    # 16 bytes per parameter). Loading reads one tensor at a time as well.

    def _named_params(self):
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def _full_state(self, param: torch.nn.Parameter, key: str) -> torch.Tensor:
        return self.master.get(param, key)

    def save(self, directory: Path, rank: int = 0) -> None:
        """Full fp32 weights and Adam moments (safetensors) plus counters (JSON)."""
        named = self._named_params()
        shapes = [(name, tuple(getattr(p, "ds_shape", p.shape))) for name, p in named]
        if rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
        files = _RankZeroFiles(rank, {
            "param": (directory / WEIGHTS_FILE, [TensorSpec(n, s) for n, s in shapes]),
            "moments": (directory / "optimizer.safetensors",
                        [TensorSpec(f"{k}/{n}", s) for n, s in shapes for k in MOMENTS]),
        })
        with files:
            for (name, param), (_, shape) in zip(named, shapes):
                files.write("param", name, self.master.get(param, "param").float().reshape(shape))
                for key in MOMENTS:
                    files.write("moments", f"{key}/{name}", self.master.get(param, key).float().reshape(shape))
        if rank == 0:
            state = {"updates": self.updates, "adam_step": self.master.step_count(),
                     "scheduler": _jsonable(self.scheduler.state_dict())}
            (directory / "engine.json").write_text(json.dumps(state))

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote into this already-initialised engine: the fp32 masters and
        Adam's moments, then the module's own (bf16) weights from the masters. (An evaluation reads
        the weights alone into a module without an engine: `saved_weights.py`.)"""
        from safetensors import safe_open

        state = json.loads((directory / "engine.json").read_text())
        self.updates = state["updates"]
        self.master.create_moments()
        with safe_open(directory / WEIGHTS_FILE, "pt") as weights, \
                safe_open(directory / "optimizer.safetensors", "pt") as saved:
            for name, param in self._named_params():
                self.master.set(param, "param", weights.get_tensor(name))
                for key in MOMENTS:
                    self.master.set(param, key, saved.get_tensor(f"{key}/{name}"))
        self.master.refresh_weights()
        self.master.set_step(state.get("adam_step") or self.updates)
        scheduler_state = {**state["scheduler"], "lr_lambdas": [None] * len(self.optimizer.param_groups)}
        self.scheduler.load_state_dict(scheduler_state)
        # The optimizer applies the LR it holds at the next step: set it to the schedule's.
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr


class _RankZeroFiles:
    """Rank 0's open checkpoint files (other ranks only take part in the gathers). A write that
    fails (a full disk) is held until every tensor has been gathered: the other ranks are still
    in the collectives, and rank 0 leaving them would hang the group until its timeout."""

    def __init__(self, rank: int, files: dict[str, tuple[Path, list[TensorSpec]]]):
        self.rank, self.files, self.writers, self.error = rank, files, {}, None

    def __enter__(self) -> "_RankZeroFiles":
        if self.rank == 0:
            try:
                for key, (path, specs) in self.files.items():
                    self.writers[key] = TensorFileWriter(path, specs)
            except OSError as err:
                self.error = err
        return self

    def write(self, file: str, name: str, tensor: torch.Tensor) -> None:
        if self.rank != 0 or self.error is not None:
            return
        try:
            self.writers[file].write(name, tensor)
        except OSError as err:
            self.error = err

    def __exit__(self, kind, *_) -> None:
        for writer in self.writers.values():
            if kind is None and self.error is None:
                try:
                    writer.close()
                except OSError as err:
                    self.error = err
            else:
                writer.file.close()
        if kind is None and self.error is not None:
            raise self.error


def _jsonable(state: dict) -> dict:
    return {k: v for k, v in state.items() if isinstance(v, (int, float, str, list, bool, type(None)))
            and k != "lr_lambdas"}
