"""A Llama-style layer's element-wise work between its products as compiled kernels (`layers.c`):
the residual sum with the next RMSNorm and RMSNorm's backward, the rotary pass in place, SwiGLU's
silu-and-product and its backward, each one pass over the rows instead of eager torch's several
operators. The decoding step calls them (`rollout/fast_decode.py`), and so do a training pass's
norms and MLPs (`models/fused_layers.py`).

They compute what torch's operators compute, in float32 on a CPU, up to summation order and the
exponential's last bits (about 1e-7 relative).
"""

from __future__ import annotations

import ctypes

import torch

from hflow.engine.kernels import build

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


class LayerKernels:
    """The compiled kernels, called on torch tensors. `available()` gives one, or None where they
    cannot be built here (`build.load`)."""

    def __init__(self, library: ctypes.CDLL):
        self._norm = library.add_rms_norm
        self._norm.restype = None
        self._norm.argtypes = [_POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _LONG, _LONG, ctypes.c_float, _INT]
        self._norm_backward = library.rms_norm_backward
        self._norm_backward.restype = _INT
        self._norm_backward.argtypes = [_POINTER] * 6 + [_LONG, _LONG, _INT]
        self._rotary = library.rotary
        self._rotary.restype = _INT
        self._rotary.argtypes = [_POINTER, _LONG, _LONG, _INT, _INT, _POINTER, _POINTER, _POINTER, _LONG, _INT]
        self._silu_mul = library.silu_mul
        self._silu_mul.restype = None
        self._silu_mul.argtypes = [_POINTER, _POINTER, _LONG, _POINTER, _LONG, _LONG, _INT]
        self._silu_mul_backward = library.silu_mul_backward
        self._silu_mul_backward.restype = None
        self._silu_mul_backward.argtypes = [_POINTER] * 5 + [_LONG, _INT]

    def add_rms_norm(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                     rstd: torch.Tensor | None = None) -> torch.Tensor:
        """h += delta in place (unless delta is None), then RMSNorm(h) x weight as a new tensor;
        h and delta (rows, hidden), weight (hidden,); each row's 1 / sqrt(mean(h^2) + eps) also into
        `rstd` (rows,) if given."""
        rows, width = h.shape
        _check("add_rms_norm", h, (rows, width))
        _check("add_rms_norm", weight, (width,))
        if delta is not None:
            _check("add_rms_norm", delta, (rows, width))
        if rstd is not None:
            _check("add_rms_norm", rstd, (rows,))
        out = torch.empty_like(h)
        self._norm(h.data_ptr(), None if delta is None else delta.data_ptr(), out.data_ptr(), weight.data_ptr(),
                   None if rstd is None else rstd.data_ptr(), rows, width, eps, torch.get_num_threads())
        return out

    def rms_norm_backward(self, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                          rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(dx, dweight) of RMSNorm(x) x weight from the output's gradient (rows, hidden) and the
        forward's input and `rstd` (`add_rms_norm`)."""
        rows, width = x.shape
        for name, t, shape in (("grad", grad, (rows, width)), ("x", x, (rows, width)), ("weight", weight, (width,)),
                               ("rstd", rstd, (rows,))):
            _check(f"rms_norm_backward {name}", t, shape)
        dx, dweight = torch.empty_like(x), torch.empty_like(weight)
        if self._norm_backward(grad.data_ptr(), x.data_ptr(), weight.data_ptr(), rstd.data_ptr(), dx.data_ptr(),
                               dweight.data_ptr(), rows, width, torch.get_num_threads()):
            raise MemoryError("the rms_norm_backward kernel could not allocate its scratch")
        return dx, dweight

    def rotary_(self, x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, signed_sin: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
        """The rotary pass in place over the first `heads` heads of each row of x (B, width), at row
        r's position `positions[r]` in the tables cos and signed_sin (capacity, head_dim; -sin in
        each head's first half, `FastDecoder.signed_sin`). Returns x."""
        rows, capacity = x.shape[0], cos.shape[0]
        if x.dim() != 2 or x.stride(1) != 1 or x.shape[1] < heads * head_dim or head_dim % 2:
            raise ValueError(f"the rotary kernel's rows: {tuple(x.shape)}/{x.stride()} for {heads} heads of "
                             f"{head_dim}")
        _check("rotary", x, x.shape, contiguous=False)
        _check("rotary", cos, (capacity, head_dim))
        _check("rotary", signed_sin, (capacity, head_dim))
        if positions.dtype != torch.int64 or positions.shape != (rows,) or not positions.is_contiguous():
            raise ValueError(f"the rotary kernel's positions: {positions.dtype} {tuple(positions.shape)} "
                             f"for {rows} rows")
        if self._rotary(x.data_ptr(), rows, x.stride(0), heads, head_dim, cos.data_ptr(), signed_sin.data_ptr(),
                        positions.data_ptr(), capacity, torch.get_num_threads()):
            raise ValueError(f"the rotary kernel was given a position outside its table's {capacity} rows")
        return x

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) x up (B, inter) from the joined gate/up projection's rows (B, 2 inter)."""
        rows, width = gate_up.shape
        _check("silu_mul", gate_up, (rows, width))
        if width % 2:
            raise ValueError(f"the silu_mul kernel's joined gate/up rows are {width} wide, not an even width")
        inter = width // 2
        out = gate_up.new_empty(rows, inter)
        self._silu_mul(gate_up.data_ptr(), gate_up[:, inter:].data_ptr(), width, out.data_ptr(), rows, inter,
                       torch.get_num_threads())
        return out

    def silu_times(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """silu(gate) x up of two contiguous tensors of one shape."""
        _check("silu_times gate", gate, up.shape)
        _check("silu_times up", up, gate.shape)
        out = torch.empty_like(gate)
        width = gate.shape[-1]  # row by row, the rows shared by the threads
        self._silu_mul(gate.data_ptr(), up.data_ptr(), width, out.data_ptr(), gate.numel() // width, width,
                       torch.get_num_threads())
        return out

    def silu_times_backward(self, grad: torch.Tensor, gate: torch.Tensor,
                            up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(dgate, dup) of `silu_times` from its output's gradient (contiguous, of the same shape)."""
        for name, t in (("grad", grad), ("gate", gate), ("up", up)):
            _check(f"silu_times_backward {name}", t, gate.shape)
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
        self._silu_mul_backward(grad.data_ptr(), gate.data_ptr(), up.data_ptr(), dgate.data_ptr(), dup.data_ptr(),
                                gate.numel(), torch.get_num_threads())
        return dgate, dup


def _check(kernel: str, t: torch.Tensor, shape: tuple, contiguous: bool = True) -> None:
    """The layout a kernel reads: float32 on the CPU, of this shape, contiguous (a wrong stride would
    read the wrong memory, not fail)."""
    if (t.dtype != torch.float32 or not t.is_cpu or tuple(t.shape) != tuple(shape)
            or (contiguous and not t.is_contiguous())):
        raise ValueError(f"the {kernel} kernel takes contiguous float32 CPU tensors of shape {tuple(shape)}, "
                         f"not {t.dtype} {tuple(t.shape)}/{t.stride()} on {t.device}")


def available() -> LayerKernels | None:
    """The kernels, built and loaded once per process (`build.load`), or None where they cannot be."""
    return build.wrapped("layers", LayerKernels)
