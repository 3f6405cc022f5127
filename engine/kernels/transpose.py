"""A float32 matrix's transpose copied into rows by a compiled kernel (`transpose.c`): the copy a
weight gradient's oneDNN product needs of its output gradient (`cpu_products.weight_grad_product`),
which torch makes on one thread. The same bits as `x.t().contiguous()`."""

from __future__ import annotations

import ctypes

import torch

from hflow.engine.kernels import build

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


class Transpose:
    """The compiled kernel, called on torch tensors. `available()` gives one, or None where the
    kernel cannot be built here (`build.load`)."""

    def __init__(self, library: ctypes.CDLL):
        self.call = library.transpose
        self.call.restype = None
        self.call.argtypes = [_POINTER, _LONG, _LONG, _LONG, _POINTER, _LONG, _INT]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (rows, cols), float32 on the CPU with unit column stride, as a new (cols, rows) tensor
        in rows: x.t().contiguous()."""
        if x.dtype != torch.float32 or not x.is_cpu or x.dim() != 2 or x.stride(1) != 1:
            raise ValueError(f"the transpose kernel takes a float32 CPU matrix whose rows are contiguous, "
                             f"not {x.dtype} {tuple(x.shape)}/{x.stride()} on {x.device}")
        rows, cols = x.shape
        out = x.new_empty(cols, rows)
        if x.numel():
            self.call(x.data_ptr(), rows, cols, x.stride(0), out.data_ptr(), rows, torch.get_num_threads())
        return out


def available() -> Transpose | None:
    """The kernel, built and loaded once per process (`build.load`), or None where it cannot be."""
    return build.wrapped("transpose", Transpose)


def in_rows(t: torch.Tensor) -> torch.Tensor:
    """`t` (2-D) as a tensor in rows: itself where it is, else its copy, by the kernel where `t` is
    the transpose of a float32 CPU matrix in rows and the kernel runs here, else by torch."""
    if t.is_contiguous():
        return t
    kernel = available() if t.dtype == torch.float32 and t.is_cpu and t.dim() == 2 else None
    if kernel is not None and t.stride(0) == 1:
        return kernel(t.t())
    return t.contiguous()
