"""A decoding step's products as a compiled kernel (`thin_products.c`): y = x W^T (+ b) for a
decoding batch's few rows, on weights packed once per batch into panels of 16 output columns, each
weight read by one thread only, the lines of weights it reads next asked for ahead. The same sums
as a product's, in another order (about 1e-7 of each output, relative). Built for AVX-512 only (its
32 vector registers hold a group of rows' sums); elsewhere the step keeps oneDNN's products.

On the 2-core Zen 5 EPYC (2026-12-07, `benchmarks/thin_products_ab.py`, all of SmolLM2's step
products, every layer's weights from memory): 1.09-1.21x oneDNN's at 4-16 rows, 1.11-1.13x at
24-64, 1.39x at one row; SmolLM2's whole rollout 1.22x (`benchmarks/decode_attention_ab.py --kernel
thin --rollout grpo/smollm2-arithmetic`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from hflow.engine.kernels import build

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
PANEL = 16


@dataclass(frozen=True)
class Panels:
    """A weight (out, in) packed for `ThinProducts` (`ThinProducts.pack`): a copy."""

    data: torch.Tensor  # (ceil(out / 16) x in x 16,) float32
    out: int
    inner: int


class ThinProducts:
    """The compiled kernel, called on torch tensors. `available()` gives one, or None where the
    kernel cannot be built here (`build.load`)."""

    def __init__(self, library: ctypes.CDLL):
        self._pack = library.pack_panels
        self._pack.restype = None
        self._pack.argtypes = [_POINTER, _LONG, _LONG, _LONG, _POINTER, _INT]
        self._product = library.thin_product
        self._product.restype = None
        self._product.argtypes = [_POINTER, _LONG, _LONG, _LONG, _POINTER, _LONG, _POINTER, _POINTER, _INT]

    @torch.no_grad()
    def pack(self, weight: torch.Tensor) -> Panels:
        """`weight` (out, in), float32 on the CPU with contiguous rows, copied into panels."""
        if weight.dtype != torch.float32 or not weight.is_cpu or weight.dim() != 2 or weight.stride(1) != 1:
            raise ValueError(f"the thin products' weights are float32 CPU matrices with contiguous rows, not "
                             f"{weight.dtype} {tuple(weight.shape)}/{weight.stride()} on {weight.device}")
        out, inner = weight.shape
        data = torch.empty(-(-out // PANEL) * inner * PANEL)
        self._pack(weight.data_ptr(), weight.stride(0), out, inner, data.data_ptr(), torch.get_num_threads())
        return Panels(data, out, inner)

    def __call__(self, x: torch.Tensor, panels: Panels, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (rows, in) @ W^T (+ bias): (rows, out), contiguous. x float32 on the CPU, rows contiguous."""
        if (x.dtype != torch.float32 or not x.is_cpu or x.dim() != 2 or x.shape[1] != panels.inner
                or x.stride(1) != 1):
            raise ValueError(f"the thin products take float32 CPU rows (rows, {panels.inner}) with contiguous "
                             f"rows, not {x.dtype} {tuple(x.shape)}/{x.stride()} on {x.device}")
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_cpu or bias.shape != (panels.out,)
                                 or not bias.is_contiguous()):
            raise ValueError(f"the thin products' bias: {bias.dtype} {tuple(bias.shape)} for {panels.out} outputs")
        y = torch.empty(x.shape[0], panels.out)
        self._product(x.data_ptr(), x.stride(0), x.shape[0], panels.inner, panels.data.data_ptr(), panels.out,
                      None if bias is None else bias.data_ptr(), y.data_ptr(), torch.get_num_threads())
        return y


def available() -> ThinProducts | None:
    """The kernel, built and loaded once per process (`build.load`), or None where it cannot be."""
    return build.wrapped("thin_products", ThinProducts)
