"""A Llama-style model's RMSNorms and SwiGLU MLPs with their element-wise work compiled, forward
and backward (`engine/kernels/layers.c`), on a CPU in float32.

Eager torch runs an RMSNorm as six operators and its backward as about as many again, SwiGLU's
silu and product as two and a backward of five, each a pass over the layer's tokens with a fresh
output; on the 2-core development machine, at the 27.5M model's update (3,693 tokens of 512, 1,536
inside the MLP) an RMSNorm's forward and backward took 11.7 ms and SwiGLU's 21.8, several times
what reading and writing their tensors takes. Here each is one pass forward and one backward (3.7
and 13.7 ms; the update 1.08x faster: `benchmarks/fused_layers_ab.py`), and each keeps less for
the backward (the input and one number per row for a norm, where torch keeps its normalised copy
too; SwiGLU's two inputs, not also the silu's output).

`fuse_layers(model)` gives each supported module a subclass whose forward takes that path where it
applies (a float32 CPU tensor, the kernels built here, the parameters whole) and the module's own
forward elsewhere (a GPU, bfloat16, ZeRO-3's partitioned parameters, `HFLOW_CPU_KERNELS=off`): the
same parameters, hooks and state dict, as `product_route.route_linears` does for the products.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from hflow.engine.kernels import layers
from hflow.engine.kernels.layers import LayerKernels

# transformers' modules whose forward these compute exactly (in float32): the RMSNorm as
# `weight * (x * rsqrt(mean(x^2) + eps))`, the MLP as `down(act(gate(x)) * up(x))`.
NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm"}
MLPS = {"LlamaMLP", "Qwen2MLP", "MistralMLP"}


def _kernels_for(*tensors: torch.Tensor) -> LayerKernels | None:
    """The kernels where this call can take them: float32 CPU tensors, whole (not ZeRO-3's
    partitioned parameters, whose data DeepSpeed empties between the forward and the backward)."""
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or hasattr(t, "ds_id") for t in tensors):
        return None
    return layers.available()


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, kernels):
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        rstd = rows.new_empty(rows.shape[0])
        out = kernels.add_rms_norm(rows, None, weight.contiguous(), eps, rstd)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.kernels = kernels
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        rows, weight, rstd = ctx.saved_tensors
        dx, dweight = ctx.kernels.rms_norm_backward(grad.reshape(rows.shape).contiguous(), rows,
                                                    weight.contiguous(), rstd)
        return dx.view(grad.shape), dweight, None, None


class _SiluTimes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, kernels):
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        ctx.kernels = kernels
        return kernels.silu_times(gate, up)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        dgate, dup = ctx.kernels.silu_times_backward(grad.contiguous(), gate, up)
        return dgate, dup, None


class _Fused(nn.Module):
    """What the fused mixins share: a module made by `fuse_layers` pickles and copies as its base
    class fused again (the subclass is made at run time, so pickle cannot find it by name)."""

    def __reduce_ex__(self, protocol):
        _, _, *rest = super().__reduce_ex__(protocol)  # rest: the module's state
        mixin, base = type(self).__bases__
        return (_new_fused, (base, mixin), *rest)


def _new_fused(base: type, mixin: type) -> nn.Module:
    cls = _fused_class(base, mixin)
    return cls.__new__(cls)


class FusedRMSNorm(_Fused):
    """Mixed into an RMSNorm's class by `fuse_layers`: its forward through the kernels where they apply."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = _kernels_for(x, self.weight)
        if kernels is None:
            return super().forward(x)
        return _RMSNorm.apply(x, self.weight, self.variance_epsilon, kernels)


class FusedMLP(_Fused):
    """Mixed into a SwiGLU MLP's class by `fuse_layers`: silu(gate(x)) x up(x) in one pass each way."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        kernels = _kernels_for(gate, up)
        if kernels is None:
            return self.down_proj(self.act_fn(gate) * up)  # the module's own forward
        return self.down_proj(_SiluTimes.apply(gate, up, kernels))


@functools.cache
def _fused_class(base: type, mixin: type) -> type:
    """`base` with `mixin`'s forward, named as `base` (one class per base)."""
    return type(base.__name__, (mixin, base), {"__module__": __name__, "__qualname__": base.__name__})


def fuse_layers(model: nn.Module) -> int:
    """Give every supported RMSNorm and SwiGLU MLP of `model` the fused forward, in place (their
    classes become subclasses; nothing else changes); returns how many modules."""
    count = 0
    for module in model.modules():
        name = type(module).__name__
        if name in NORMS and not isinstance(module, FusedRMSNorm) and hasattr(module, "variance_epsilon"):
            module.__class__ = _fused_class(type(module), FusedRMSNorm)
        elif name in MLPS and not isinstance(module, FusedMLP) and _is_silu(module):
            module.__class__ = _fused_class(type(module), FusedMLP)
        else:
            continue
        count += 1
    return count


def _is_silu(mlp: nn.Module) -> bool:
    """An MLP whose activation is the silu (torch's module or transformers' `SiLUActivation`)."""
    act = type(getattr(mlp, "act_fn", None))
    return (act is nn.SiLU or (act.__name__ == "SiLUActivation" and act.__module__ == "transformers.activations")) \
        and all(hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))
