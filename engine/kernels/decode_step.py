"""The decoding step's element-wise work between its products as compiled kernels
(`decode_step.c`): the residual sum with the next RMSNorm, the rotary pass in place, and SwiGLU's
silu-and-product, each one pass over the batch's rows instead of eager torch's several operators.

They compute what `fast_decode.py`'s torch path computes, in float32 on a CPU, up to summation
order and the exponential's last bits (about 1e-7 relative).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from hflow.engine.kernels import build

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


class DecodeStep:
    """The compiled kernels, called on torch tensors. `available()` gives one, or None where they
    cannot be built here (`build.load`)."""

    def __init__(self, library: ctypes.CDLL):
        self._norm = library.add_rms_norm
        self._norm.restype = None
        self._norm.argtypes = [_POINTER, _POINTER, _POINTER, _POINTER, _LONG, _LONG, ctypes.c_float, _INT]
        self._rotary = library.rotary
        self._rotary.restype = _INT
        self._rotary.argtypes = [_POINTER, _LONG, _LONG, _INT, _INT, _POINTER, _POINTER, _POINTER, _LONG, _INT]
        self._silu_mul = library.silu_mul
        self._silu_mul.restype = None
        self._silu_mul.argtypes = [_POINTER, _POINTER, _LONG, _LONG, _INT]

    def add_rms_norm(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """h += delta in place (unless delta is None), then RMSNorm(h) x weight as a new tensor;
        h and delta (B, hidden), weight (hidden,)."""
        rows, width = h.shape
        _check("add_rms_norm", h, (rows, width))
        _check("add_rms_norm", weight, (width,))
        if delta is not None:
            _check("add_rms_norm", delta, (rows, width))
        out = torch.empty_like(h)
        self._norm(h.data_ptr(), None if delta is None else delta.data_ptr(), out.data_ptr(), weight.data_ptr(),
                   rows, width, eps, torch.get_num_threads())
        return out

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
        out = gate_up.new_empty(rows, width // 2)
        self._silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, width // 2, torch.get_num_threads())
        return out


def _check(kernel: str, t: torch.Tensor, shape: tuple, contiguous: bool = True) -> None:
    """The layout a kernel reads: float32 on the CPU, of this shape, contiguous (a wrong stride would
    read the wrong memory, not fail)."""
    if (t.dtype != torch.float32 or t.device.type != "cpu" or tuple(t.shape) != tuple(shape)
            or (contiguous and not t.is_contiguous())):
        raise ValueError(f"the {kernel} kernel takes contiguous float32 CPU tensors of shape {tuple(shape)}, "
                         f"not {t.dtype} {tuple(t.shape)}/{t.stride()} on {t.device}")


def available() -> DecodeStep | None:
    """The kernels, built and loaded once per process (`build.load`), or None where they cannot be."""
    library = build.load("decode_step")
    return None if library is None else _wrapped(library)


@functools.cache
def _wrapped(library: ctypes.CDLL) -> DecodeStep:
    return DecodeStep(library)
