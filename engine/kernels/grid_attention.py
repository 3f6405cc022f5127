"""A packed batch's attention on a CPU in float32 as a compiled kernel (`grid_attention.c`), forward
and backward: what `engine/training/packed.py`'s grids ran through torch's
`scaled_dot_product_attention` (its CPU flash kernel), the same softmax(scale q k^T + mask) v with
grouped-query heads, a boolean mask or a causal one. The sums run in another order (about 1e-6 of
the outputs and gradients, relative to their largest).

`attention(q, k, v, mask, causal, scale)` is differentiable (`torch.autograd.Function`); `usable`
says whether the kernel takes the call (else the caller keeps torch's).
"""

from __future__ import annotations

import ctypes

import torch

from hflow.engine.kernels import build

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
LANES = 16


class GridAttention:
    """The compiled kernel, called on torch tensors. `available()` gives one, or None where the
    kernel cannot be built here (`build.load`)."""

    def __init__(self, library: ctypes.CDLL):
        self._forward = library.grid_attention_forward
        self._forward.restype = _INT
        self._forward.argtypes = [_POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _LONG, _INT,
                                  _POINTER, _POINTER, _INT, _INT, _INT, _INT, _INT, _INT, ctypes.c_float, _INT]
        self._backward = library.grid_attention_backward
        self._backward.restype = _INT
        self._backward.argtypes = [_POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _LONG, _INT,
                                   _POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _INT, _INT,
                                   _INT, _INT, _INT, _INT, ctypes.c_float, _INT]

    def forward(self, q, k, v, mask, causal: bool, scale: float, keep_lse: bool):
        """(out, lse or None) for float32 q (B, Hq, Lq, d), k and v (B, Hkv, Lk, d) as `_laid_out`
        gives them, mask as `_mask` does; out has q's strides."""
        batch, kv_heads, keys, head_dim = k.shape
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3]) if keep_lse else None
        mask_at, mask_batch = _mask_pointer(mask)
        failed = self._forward(q.data_ptr(), _strides(q), k.data_ptr(), _strides(k), v.data_ptr(), _strides(v),
                               mask_at, mask_batch, int(causal), out.data_ptr(),
                               None if lse is None else lse.data_ptr(), batch, kv_heads, q.shape[1] // kv_heads,
                               q.shape[2], keys, head_dim, scale, torch.get_num_threads())
        if failed:
            raise MemoryError("the grid attention kernel could not allocate its scratch")
        return out, lse

    def backward(self, q, k, v, mask, causal: bool, scale: float, out, lse, dout):
        """(dq, dk, dv), each with its input's strides, for the forward's tensors and out's gradient
        `dout` (laid out as `_laid_out` gives it)."""
        batch, kv_heads, keys, head_dim = k.shape
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        mask_at, mask_batch = _mask_pointer(mask)
        failed = self._backward(q.data_ptr(), _strides(q), k.data_ptr(), _strides(k), v.data_ptr(), _strides(v),
                                mask_at, mask_batch, int(causal), out.data_ptr(), lse.data_ptr(), dout.data_ptr(),
                                _strides(dout), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), batch, kv_heads,
                                q.shape[1] // kv_heads, q.shape[2], keys, head_dim, scale, torch.get_num_threads())
        if failed:
            raise MemoryError("the grid attention kernel could not allocate its scratch")
        return dq, dk, dv


def _strides(t: torch.Tensor) -> ctypes.Array:
    """A 4D tensor's batch, head and row strides, as the kernel reads them."""
    return (_LONG * 3)(*t.stride()[:3])


def _laid_out(t: torch.Tensor) -> torch.Tensor:
    """t where each row's head_dim floats are contiguous and its elements fill their memory in some
    order of its dimensions (a grid's transposed (B, L, H, d) layout: kept, and so the outputs',
    which `empty_like` makes with the same strides and a gather reads without a copy); else a
    contiguous copy."""
    order = sorted(range(4), key=lambda i: (t.stride(i), -i))
    expected, dense = 1, t.stride(3) == 1 or t.shape[3] == 1
    for i in order:
        dense = dense and (t.shape[i] == 1 or t.stride(i) == expected)
        expected *= t.shape[i]
    return t if dense else t.contiguous()


def _mask_pointer(mask: torch.Tensor | None) -> tuple[int | None, int]:
    if mask is None:
        return None, 0
    return mask.data_ptr(), mask.stride(0) if mask.shape[0] > 1 else 0


def usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether the kernel computes this call: CPU float32 tensors of 4 dimensions, a head width of
    whole 16-float vectors, query heads a whole multiple of the key-value heads, keys and values of
    the queries' batch, a boolean mask (B or 1, 1, Lq, Lk) or none."""
    if not (q.is_cpu and q.dtype == k.dtype == v.dtype == torch.float32 and q.dim() == k.dim() == v.dim() == 4):
        return False
    batch, heads, queries, head_dim = q.shape
    if (k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim or head_dim % LANES
            or heads % k.shape[1] or queries == 0 or k.shape[2] == 0):
        return False
    return mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[0] in (1, batch)
                            and mask.shape[1:] == (1, queries, k.shape[2]))


def _mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask with each row's (queries, keys) bytes contiguous, as the kernel reads them."""
    if mask is None:
        return None
    queries, keys = mask.shape[2:]
    return mask if mask[0].stride() == (queries * keys, keys, 1) else mask.contiguous()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, kernel):
        q, k, v = _laid_out(q), _laid_out(k), _laid_out(v)
        keep = any(ctx.needs_input_grad[:3])
        out, lse = kernel.forward(q, k, v, mask, causal, scale, keep)
        if keep:
            ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.causal, ctx.scale, ctx.kernel = mask, causal, scale, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(q, k, v, ctx.mask, ctx.causal, ctx.scale, out, lse, _laid_out(dout))
        return dq, dk, dv, None, None, None, None


def attention(kernel: GridAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None = None, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(scale q k^T + mask) v as torch's `scaled_dot_product_attention(q, k, v, attn_mask=mask,
    is_causal=causal, scale=scale, enable_gqa=True)` computes it, where `usable` says so; a query
    that attends no key gives zeros."""
    if mask is not None and causal:
        raise ValueError("the grid attention kernel takes a mask or a causal grid, not both")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _Attention.apply(q, k, v, _mask(mask), causal, float(scale), kernel)


def available() -> GridAttention | None:
    """The kernel, built and loaded once per process (`build.load`), or None where it cannot be."""
    return build.wrapped("grid_attention", GridAttention)
