"""The DeepSpeed ZeRO training engine of a trained role (the actor; later the critics).

One object owns the DeepSpeed engine, its AdamW optimizer and LR schedule, and saves
and restores them without pickles: weights and Adam moments as safetensors, the
rest as JSON. Per-parameter full states come from DeepSpeed's tensor-fragment API,
so the same checkpoint serves every ZeRO stage and data-parallel size.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hflow.engine.workers.config import OptimSpec

MOMENTS = ("exp_avg", "exp_avg_sq")


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


class TrainEngine:
    """DeepSpeed-wrapped model + AdamW + schedule; `micro_steps` micro-batches per update."""

    def __init__(self, model: torch.nn.Module, cfg: OptimSpec, total_updates: int,
                 micro_batch_size: int, micro_steps: int, bf16: bool):
        import deepspeed

        self.cfg = cfg
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_updates))
        ds_config = {
            "train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": micro_steps,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "bf16": {"enabled": bf16},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        self.updates = 0

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
        norm = None
        if boundary and self.cfg.zero_stage == 0:
            # Without ZeRO, DeepSpeed clips but does not report the norm: measure it first.
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads)
        self.engine.step()
        if not boundary:
            return None
        self.updates += 1
        if norm is None:
            norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

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
        AdamW so that the same engine runs on CPU). Stage 0 (and any DeepSpeed optimizer wrapper
        without `offload_states`, such as BF16_Optimizer) keeps its states on the GPU.
        The bf16 weights stay on the GPU in every stage: the weight sync reads them.
        """
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as State

        if not self._can_offload():
            return []
        if self.cfg.zero_stage == 3:
            include = [State.lp_grads, State.contiguous_grad_buffer]
        else:
            include = [State.optim_states, State.hp_params, State.lp_grads]
        self.engine.offload_states(include=include)
        return [state.value for state in include]

    def reload_states(self) -> None:
        """Undo `offload_states` (a no-op when nothing was moved)."""
        if self._can_offload():
            self.engine.reload_states()

    def _can_offload(self) -> bool:
        return (self.cfg.zero_stage != 0 and self.engine.device.type == "cuda"
                and hasattr(self.engine.optimizer, "offload_states"))

    # --- checkpoints -----------------------------------------------------------------

    def _named_params(self):
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def _full_state(self, param: torch.nn.Parameter, key: str) -> torch.Tensor:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        if self.cfg.zero_stage == 0:
            return param.detach().float() if key == "param" else self.optimizer.state[param][key]
        if key == "param":
            return safe_get_full_fp32_param(param)
        return safe_get_full_optimizer_state(param, key)

    def save(self, directory: Path, rank: int = 0) -> None:
        """Full fp32 weights and Adam moments (safetensors) plus counters (JSON)."""
        weights, moments = {}, {}
        for name, param in self._named_params():
            weights[name] = self._full_state(param, "param").detach().cpu().contiguous()
            for key in MOMENTS:
                moments[f"{key}/{name}"] = self._full_state(param, key).detach().cpu().contiguous()
        if rank != 0:
            return
        directory.mkdir(parents=True, exist_ok=True)
        _save_safetensors(weights, directory / "weights.safetensors")
        _save_safetensors(moments, directory / "optimizer.safetensors")
        state = {"updates": self.updates, "scheduler": _jsonable(self.scheduler.state_dict())}
        (directory / "engine.json").write_text(json.dumps(state))

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote into this already-initialised engine."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        weights = load_file(directory / "weights.safetensors")
        moments = load_file(directory / "optimizer.safetensors")
        state = json.loads((directory / "engine.json").read_text())
        self.updates = state["updates"]
        step = torch.tensor(float(self.updates))
        if self.cfg.zero_stage != 0:
            self._create_zero_optimizer_state()
        for name, param in self._named_params():
            if self.cfg.zero_stage == 0:
                with torch.no_grad():
                    param.copy_(weights[name])
                self.optimizer.state[param] = {
                    "step": step.clone(), **{k: moments[f"{k}/{name}"].clone() for k in MOMENTS}
                }
                continue
            safe_set_full_fp32_param(param, weights[name])
            for key in MOMENTS:
                safe_set_full_optimizer_state(param, moments[f"{key}/{name}"], key)
        if self.cfg.zero_stage != 0:
            base = getattr(self.optimizer, "optimizer", self.optimizer)
            for param_state in base.state.values():
                param_state["step"] = step.clone()
        scheduler_state = {**state["scheduler"], "lr_lambdas": [None] * len(self.optimizer.param_groups)}
        self.scheduler.load_state_dict(scheduler_state)
        # The optimizer applies the LR it holds at the next step: set it to the schedule's.
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr

    def _create_zero_optimizer_state(self) -> None:
        """Adam creates its moments at the first step; a resumed engine needs them before that."""
        base = self.optimizer.optimizer
        # ZeRO-3 hands its flat fp32 partitions to the optimizer only inside step().
        flats = getattr(self.optimizer, "fp32_partitioned_groups_flat", None) or [
            p for group in base.param_groups for p in group["params"]]
        for flat in flats:
            if not base.state[flat]:
                base.state[flat] = {"step": torch.tensor(0.0), **{k: torch.zeros_like(flat) for k in MOMENTS}}
        link = getattr(self.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:  # ZeRO-1/2 point each parameter's fragment at the new moments
            link()


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """`save_file`, whose I/O failures (a full disk, a folder that cannot be written) arrive as
    SafetensorError("... (os error 28) ..."), raising them as the OSError they are."""
    try:
        save_file(tensors, path)
    except SafetensorError as err:
        code = re.search(r"\(os error (\d+)\)", str(err))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from err


def _jsonable(state: dict) -> dict:
    return {k: v for k, v in state.items() if isinstance(v, (int, float, str, list, bool, type(None)))
            and k != "lr_lambdas"}
