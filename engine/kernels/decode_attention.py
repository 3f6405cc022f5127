"""The decoding step's attention as one compiled kernel (`decode_attention.c`): what the KV caches
of `decode_cache.py` compute with batched products and a softmax on a CPU in float32, reading each
row's keys and values once: a `RowCache`'s (`__call__`: each row's own buffer) and a
`SharedPromptCache`'s (`shared`: its prompt's columns, held once for its samples, then its own).

Against the eager products, side by side on a 2-core AVX2 EPYC, 2 threads (the attention of all
of one decoding step's layers, each layer's own keys and values, so cold in cache;
`benchmarks/decode_attention_ab.py`): the 3.5M model's shapes (64 rows, 8 heads of 32, 40 and 70
columns, 4 layers) 1.35x and 1.21x, the 27.5M model's (heads of 64, 8 layers) 1.49x, SmolLM2's (32
rows, 3 key-value heads of 3 query heads, 70 columns, 30 layers) 1.46x, the 27.5M model's at 16
rows x 1,000 columns 1.51x; the kernel at 59-85% of the time of a plain read of the same keys
and values. The two differ by summation order and the exponential's last bits: about 1e-6 of the
output. Since 2026-12-07 the products over a head's width run in vectors of 16 floats written out
(`lanes`; GCC had vectorized the loop over a group's query heads instead): on the 2-core AVX-512
EPYC, SmolLM2's shapes 1.31x faster than before, at 72% of a plain read's time, the 27.5M model's
1.19-1.25x; SmolLM2's rollout 1.06x (`benchmarks/decode_attention_ab.py --before`).
"""

from __future__ import annotations

import ctypes

import torch

from hflow.engine.kernels import build

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


class DecodeAttention:
    """The compiled kernel, called on torch tensors. `available()` gives one, or None where the
    kernel cannot be built here (`build.load`)."""

    def __init__(self, library: ctypes.CDLL):
        self.call = library.decode_attention
        self.call.restype = _INT
        self.call.argtypes = [_POINTER, _LONG, _POINTER, _POINTER, _LONG, _LONG, _POINTER, _LONG, _POINTER, _POINTER,
                              _LONG, _POINTER, _INT, _INT, _INT, _INT, _INT, ctypes.c_float, _INT]
        self.call_shared = library.decode_attention_shared
        self.call_shared.restype = _INT
        self.call_shared.argtypes = [_POINTER, _LONG, _POINTER, _POINTER, _LONG, _INT, _POINTER, _POINTER, _LONG,
                                     _LONG, _POINTER, _LONG, _POINTER, _INT, _INT, _POINTER, _POINTER, _LONG, _LONG,
                                     _INT, _POINTER, _POINTER, _LONG, _LONG, _POINTER, _INT, _INT, _INT, _INT,
                                     ctypes.c_float, _INT]

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                 end: int, scale: float, new: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """softmax(scale x q K^T + mask) V over columns [0, end) of each row's buffers.

        q (B, kv_heads, group, head_dim); keys and values (B, kv_heads, capacity, head_dim) with each
        row's (kv_heads, capacity, head_dim) contiguous; mask (B, 1, 1, capacity), additive (0 or
        -inf), each row's contiguous; all float32 on the CPU. `new`: this step's keys and values
        (B, kv_heads, 1, head_dim), written into column end - 1 first (the cache's append, in the
        same pass). Returns (B, kv_heads, group, head_dim)."""
        rows, kv_heads, group, head_dim = q.shape
        q = _query(q)
        _check(q.shape, keys, values, mask, end)
        new_keys, new_values, new_row = _new(q.shape, new)
        out = torch.empty(q.shape, dtype=torch.float32)
        failed = self.call(q.data_ptr(), q.stride(0), keys.data_ptr(), values.data_ptr(), keys.stride(0),
                           keys.stride(1), mask.data_ptr(), mask.stride(0), new_keys, new_values, new_row,
                           out.data_ptr(), rows, kv_heads, group, head_dim, end, scale, torch.get_num_threads())
        return _checked(failed, out)

    def shared(self, q: torch.Tensor, prompt_keys: torch.Tensor, prompt_values: torch.Tensor,
               prompt_mask: torch.Tensor, prompt_of: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               own: int, scale: float, new: tuple[torch.Tensor, torch.Tensor] | None = None,
               prefix: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The same over up to three parts of columns, one softmax: the `prefix` every prompt begins
        with (its keys and values (1, kv_heads, prefix width, head_dim), contiguous, read by every
        row; none without), row r's prompt's keys and values, held once for all its samples
        (prompt_keys and prompt_values (prompts, kv_heads, width, head_dim), contiguous; prompt_mask
        (prompts, 1, 1, width), additive; prompt_of (B,) int64: row r's prompt), then columns
        [0, own) of its own buffers (keys and values as in `__call__`; `new` written into column
        own - 1 first)."""
        rows, kv_heads, group, head_dim = q.shape
        q = _query(q)
        _check(q.shape, keys, values, None, own)
        prompts, width = prompt_keys.shape[0], prompt_keys.shape[2]
        _check((prompts, kv_heads, group, head_dim), prompt_keys, prompt_values, prompt_mask, width)
        if prompt_of.dtype != torch.int64 or prompt_of.shape != (rows,) or not prompt_of.is_contiguous():
            raise ValueError(f"the decoding attention kernel's prompt of each row: {prompt_of.dtype} "
                             f"{tuple(prompt_of.shape)} for {rows} rows")
        prefix_keys, prefix_values, prefix_head, prefix_width = _prefix(prompt_keys, prefix)
        new_keys, new_values, new_row = _new(q.shape, new)
        out = torch.empty(q.shape, dtype=torch.float32)
        failed = self.call_shared(q.data_ptr(), q.stride(0), prefix_keys, prefix_values, prefix_head, prefix_width,
                                  prompt_keys.data_ptr(), prompt_values.data_ptr(),
                                  prompt_keys.stride(0), prompt_keys.stride(1), prompt_mask.data_ptr(),
                                  prompt_mask.stride(0), prompt_of.data_ptr(), prompts, width, keys.data_ptr(),
                                  values.data_ptr(), keys.stride(0), keys.stride(1), own, new_keys, new_values,
                                  new_row, own - 1, out.data_ptr(), rows, kv_heads, group, head_dim, scale,
                                  torch.get_num_threads())
        return _checked(failed, out)


def _checked(failed: int, out: torch.Tensor) -> torch.Tensor:
    """The kernel's answer: bit 1, a thread's scratch was not allocated; bit 2, a row named a prompt
    outside the prompts given (nothing read for it)."""
    if failed & 2:
        raise ValueError("the decoding attention kernel was given a row whose prompt is not among the prompts")
    if failed:
        raise MemoryError("the decoding attention kernel could not allocate its scratch")
    return out


def _check(shape: tuple, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, end: int) -> None:
    """The layout the kernel reads for queries of `shape` (rows, kv_heads, group, head_dim): a wrong
    stride would read the wrong memory, not fail."""
    rows, kv_heads, _, head_dim = shape
    for t in (keys, values) if mask is None else (keys, values, mask):
        if t.dtype != torch.float32 or not t.is_cpu:
            raise ValueError(f"the decoding attention kernel takes float32 CPU tensors, not {t.dtype} on {t.device}")
    capacity = keys.shape[2]
    inner = (capacity * head_dim, head_dim, 1)
    if (keys.shape != values.shape or keys.stride() != values.stride() or keys.shape[:2] != (rows, kv_heads)
            or keys.shape[3] != head_dim or keys.stride()[1:] != inner or not 0 < end <= capacity
            or (mask is not None and (mask.shape[0] != rows or mask.shape[-1] != capacity or mask.stride(-1) != 1))):
        raise ValueError(f"the decoding attention kernel's layout: q {tuple(shape)}, keys "
                         f"{tuple(keys.shape)}/{keys.stride()}, values {values.stride()}, mask "
                         f"{None if mask is None else (tuple(mask.shape), mask.stride())}, end {end}")


def _prefix(prompt_keys: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor] | None):
    """(keys and values pointers, head stride, width) of the columns every row reads first, laid out
    as the prompts' keys are but for one prompt; (None, None, 0, 0) without them."""
    if prefix is None or prefix[0].shape[2] == 0:
        return None, None, 0, 0
    k, v = prefix
    _, kv_heads, _, head_dim = prompt_keys.shape
    for t in prefix:
        if (t.dtype != torch.float32 or not t.is_cpu or t.dim() != 4 or t.shape[0] != 1
                or t.shape[1] != kv_heads or t.shape[3] != head_dim or not t.is_contiguous() or t.shape != k.shape):
            raise ValueError(f"the decoding attention kernel's prefix: {tuple(t.shape)}/{t.stride()} {t.dtype} for "
                             f"{kv_heads} key-value heads of {head_dim}")
    return k.data_ptr(), v.data_ptr(), k.stride(1), k.shape[2]


def _new(shape: tuple, new: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[int | None, int | None, int]:
    """Pointers to this step's keys and values (B, kv_heads, 1, head_dim), each row's heads contiguous
    and both rows alike, and their row stride; (None, None, 0) without them."""
    if new is None:
        return None, None, 0
    rows, kv_heads, _, head_dim = shape
    k, v = new
    for t in new:
        if (t.dtype != torch.float32 or not t.is_cpu or t.shape != (rows, kv_heads, 1, head_dim)
                or t.stride(1) != head_dim or t.stride(3) != 1 or t.stride(0) != k.stride(0)):
            raise ValueError(f"the decoding attention kernel's new keys and values: {tuple(t.shape)}/{t.stride()} "
                             f"{t.dtype} for queries {tuple(shape)}")
    return k.data_ptr(), v.data_ptr(), k.stride(0)


def _query(q: torch.Tensor) -> torch.Tensor:
    """q with each row's (kv_heads, group, head_dim) contiguous, as the kernel reads it."""
    _, _, group, head_dim = q.shape
    if q.dtype != torch.float32 or not q.is_cpu:
        raise ValueError(f"the decoding attention kernel takes float32 CPU tensors, not {q.dtype} on {q.device}")
    return q if q[0].stride() == (group * head_dim, head_dim, 1) else q.contiguous()


def available() -> DecodeAttention | None:
    """The kernel, built and loaded once per process (`build.load`), or None where it cannot be."""
    return build.wrapped("decode_attention", DecodeAttention)
