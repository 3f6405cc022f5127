"""Each trained parameter's full fp32 state (master weight, Adam moments), wherever DeepSpeed keeps it.

What the optimizer updates is not always the module's parameter. DeepSpeed 0.19.8 wraps the
client optimizer by configuration (runtime/engine.py `_do_optimizer_sanity_check`):

  ZeRO-0, fp32             the torch optimizer itself: its state is keyed by the parameter
  ZeRO-0, bf16             FP16_UnfusedOptimizer (fp16/unfused_optimizer.py): one fp32 master per
                           parameter (`fp32_groups`, beside `fp16_groups`); the state is keyed by
                           the master, and each step copies the master back into the bf16 weight
  ZeRO-1 bf16 + fp32 grads BF16_Optimizer (bf16_optimizer.py), ZeRO-1/2: DeepSpeedZeroOptimizer:
                           flat fp32 partitions; each parameter reaches its fragment through
                           `param._hp_mapping` (the tensor-fragment API, utils/tensor_fragment.py)
  ZeRO-3                   flat fp32 partitions per sub-group; `param.ds_id` locates its slice

Reading the bf16 parameter (or `optimizer.state[param]`) instead of the master is how a bf16
ZeRO-0 checkpoint failed (KeyError 'exp_avg') and how writing the bf16 copy on resume would have
been undone by the next step copying the stale master back. `MasterState` hides the layouts:
`get`/`set` take a parameter and a key ("param" or an Adam moment). Under ZeRO they are
collective (every rank calls them for the same parameters in the same order).
"""

from __future__ import annotations

import torch

MOMENTS = ("exp_avg", "exp_avg_sq")


class MasterState:
    def __init__(self, optimizer):
        self.optimizer = optimizer  # DeepSpeed's wrapper, or the client optimizer itself
        self.base = getattr(optimizer, "optimizer", optimizer)  # the torch AdamW
        groups = zip(getattr(optimizer, "fp16_groups", ()), getattr(optimizer, "fp32_groups", ()))
        self.pairs = [(low, high) for lows, highs in groups for low, high in zip(lows, highs)]  # ZeRO-0 bf16
        self.masters = {id(low): high for low, high in self.pairs}

    @staticmethod
    def _fragmented(param: torch.nn.Parameter) -> bool:
        # Every parameter of a ZeRO-1/2 (or BF16_Optimizer) model has `_hp_mapping`, None on the ranks
        # whose partition holds none of it: those still take part in the gather (with zeros).
        return hasattr(param, "ds_id") or hasattr(param, "_hp_mapping")

    def get(self, param: torch.nn.Parameter, key: str) -> torch.Tensor:
        """The whole fp32 tensor of `param`'s master weight (`key` "param") or Adam moment."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        if self._fragmented(param):
            return safe_get_full_fp32_param(param) if key == "param" else safe_get_full_optimizer_state(param, key)
        master = self.masters.get(id(param), param)
        return master.detach() if key == "param" else self.base.state[master][key]

    def set(self, param: torch.nn.Parameter, key: str, value: torch.Tensor) -> None:
        """Write `param`'s whole fp32 master weight or moment (this rank keeps its part). After
        the weights, `refresh_weights` copies the masters into the module's parameters."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        if self._fragmented(param):
            if key == "param":
                safe_set_full_fp32_param(param, value)
            else:
                safe_set_full_optimizer_state(param, value, key)
            return
        master = self.masters.get(id(param), param)
        target = master if key == "param" else self.base.state[master][key]
        with torch.no_grad():
            target.copy_(value.reshape(target.shape))

    def create_moments(self) -> None:
        """Adam creates its moments at the first step; a resumed engine needs them before that.
        Under ZeRO-3 the optimizer's parameters are the flat fp32 partitions, which DeepSpeed
        hands it only inside step()."""
        flats = getattr(self.optimizer, "fp32_partitioned_groups_flat", None) or [
            p for group in self.base.param_groups for p in group["params"]]
        for flat in flats:
            if not self.base.state[flat]:
                self.base.state[flat] = {"step": self._step_tensor(flat, 0.0),
                                         **{k: torch.zeros_like(flat) for k in MOMENTS}}
        self.relink_moments()

    def _step_tensor(self, param: torch.Tensor, step: float) -> torch.Tensor:
        """Adam's step as torch keeps it: on the parameter's device for the fused (and capturable)
        kernels, which refuse a CPU step beside GPU parameters; a CPU scalar otherwise."""
        group = self.base.param_groups[0]
        on_device = group.get("fused") or group.get("capturable")
        return torch.tensor(float(step), dtype=torch.float32, device=param.device if on_device else "cpu")

    def relink_moments(self) -> None:
        """Point each ZeRO-1/2 (and BF16_Optimizer) parameter fragment at the optimizer's current
        moment tensors. DeepSpeed links them once, after the first step; `reload_states` rebuilds
        the fragments (hp_params) and replaces the moment tensors (optim_states) without linking
        again, so a checkpoint after an offload found no moments (or stale ones)."""
        link = getattr(self.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is None:
            return
        if hasattr(self.optimizer, "_hp_optimizer_states_linked"):
            self.optimizer._hp_optimizer_states_linked = False
        if all(self.base.state[p] for group in self.base.param_groups for p in group["params"]):
            link()

    def step_count(self) -> float | None:
        """Adam's step counter (its bias correction's t), None before the first step. It can run
        ahead of the updates made: DeepSpeed's FP16_UnfusedOptimizer (bf16 ZeRO-0) takes one
        step on zero gradients when it is built, to create the moments."""
        steps = [state["step"] for state in self.base.state.values() if "step" in state]
        return float(steps[0]) if steps else None

    def set_step(self, step: float) -> None:
        for param, state in self.base.state.items():
            state["step"] = self._step_tensor(param, step)

    @torch.no_grad()
    def refresh_weights(self) -> None:
        """The module's (bf16 or fp32) parameters from the masters, after `set(..., "param")`."""
        opt = self.optimizer
        if hasattr(opt, "update_lp_params"):  # ZeRO-1/2, BF16_Optimizer: also all-gathers them
            opt.update_lp_params()
        elif hasattr(opt, "fp32_partitioned_groups_flat"):  # ZeRO-3: each rank's partition
            for group in range(len(opt.fp16_partitioned_groups_flat)):
                opt._reassign_or_swap_out_partitioned_parameters(group)
        for low, high in self.pairs:
            low.copy_(high)
