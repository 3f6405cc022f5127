"""The decoding step's attention over a row-per-sample KV cache, as one compiled kernel
(`decode_attention.c`): what `decode_cache.RowCache` computes with two batched products and a
softmax on a CPU in float32, reading each row's keys and values once.

Against the eager products, side by side on a 2-core AVX2 EPYC, 2 threads (the attention of all
of one decoding step's layers, each layer's own keys and values, so cold in cache;
`benchmarks/decode_attention_ab.py`): the 3.5M model's shapes (64 rows, 8 heads of 32, 40 and 70
columns, 4 layers) 1.35x and 1.21x, the 27.5M model's (heads of 64, 8 layers) 1.49x, SmolLM2's (32
rows, 3 key-value heads of 3 query heads, 70 columns, 30 layers) 1.46x, the 27.5M model's at 16
rows x 1,000 columns 1.51x; the kernel at 59-85% of the time of a plain read of the same keys
and values. The two differ by summation order and the exponential's last bits: about 1e-6 of the
output.
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
        self.call.argtypes = [_POINTER, _LONG, _POINTER, _POINTER, _LONG, _LONG, _POINTER, _LONG, _POINTER,
                              _INT, _INT, _INT, _INT, _INT, ctypes.c_float, _INT]

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                 end: int, scale: float) -> torch.Tensor:
        """softmax(scale x q K^T + mask) V over columns [0, end) of each row's buffers.

        q (B, kv_heads, group, head_dim); keys and values (B, kv_heads, capacity, head_dim) with each
        row's (kv_heads, capacity, head_dim) contiguous; mask (B, 1, 1, capacity), additive (0 or
        -inf), each row's contiguous; all float32 on the CPU. Returns (B, kv_heads, group, head_dim)."""
        rows, kv_heads, group, head_dim = q.shape
        if q[0].stride() != (group * head_dim, head_dim, 1):
            q = q.contiguous()
        _check(keys, values, mask, q, end)
        out = torch.empty(q.shape, dtype=torch.float32)
        failed = self.call(q.data_ptr(), q.stride(0), keys.data_ptr(), values.data_ptr(), keys.stride(0),
                           keys.stride(1), mask.data_ptr(), mask.stride(0), out.data_ptr(), rows, kv_heads,
                           group, head_dim, end, scale, torch.get_num_threads())
        if failed:
            raise MemoryError("the decoding attention kernel could not allocate its scratch")
        return out


def _check(keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, q: torch.Tensor, end: int) -> None:
    """The layout the kernel reads (a wrong stride would read the wrong memory, not fail)."""
    rows, kv_heads, _, head_dim = q.shape
    for t in (q, keys, values, mask):
        if t.dtype != torch.float32 or t.device.type != "cpu":
            raise ValueError(f"the decoding attention kernel takes float32 CPU tensors, not {t.dtype} on {t.device}")
    capacity = keys.shape[2]
    inner = (capacity * head_dim, head_dim, 1)
    if (keys.shape != values.shape or keys.stride() != values.stride() or keys.shape[:2] != (rows, kv_heads)
            or keys.shape[3] != head_dim or keys.stride()[1:] != inner or mask.shape[0] != rows
            or mask.shape[-1] != capacity or mask.stride(-1) != 1 or not 0 < end <= capacity):
        raise ValueError(f"the decoding attention kernel's layout: q {tuple(q.shape)}, keys "
                         f"{tuple(keys.shape)}/{keys.stride()}, values {values.stride()}, mask "
                         f"{tuple(mask.shape)}/{mask.stride()}, end {end}")


def available() -> DecodeAttention | None:
    library = build.load("decode_attention")
    return None if library is None else DecodeAttention(library)
