"""Matrix products on a CPU: oneDNN's kernels where they are faster than the BLAS torch calls.

torch runs a float32 `F.linear` or `mm` on a CPU through its BLAS (MKL in the x86 wheels). On
some CPUs that BLAS runs well below the machine: on the 2-core AMD EPYC (AVX-512) that develops
hflow, MKL's products ran at 217-233 GFLOP/s and oneDNN's (also inside torch, the library its
compiler uses) at 486-525 on the same (4,096 x 576) x (576 x 1,536) float32 forward and
input-gradient products, 365-380 on the weight gradient; a decoding step's products at 12-32 rows
ran 1.4-1.9x faster, 2.0-2.8x with the weights reordered for the rows (`packed`); measured by
`benchmarks/cpu_products.py` (2026-11-27).
Both compute in float32 (no reduced-precision arithmetic): they differ only in summation order,
about 1e-6 of the result.

This module holds the products themselves, each kind both ways (`forward_product`,
`input_grad_product`, `weight_grad_product`), and the weights reordered for a decoding step
(`packed`, `decodes_packed`); which library each kind takes on this machine, and the layers that
take it, are `product_route.py`'s. A weight gradient's first operand dy^T, which oneDNN reads in
rows, is copied into rows by a compiled kernel (`transpose.py`), not by torch's one-thread copy
inside oneDNN's call: at SmolLM2's update, the LM head's weight gradient took 200 ms against 234,
its copy of dy^T 20 against 59, the layers' 4-14% less; the whole update 1.03-1.06x faster there,
the 27.5M model's 1.07x (2026-12-07, `benchmarks/transpose_ab.py`).

oneDNN keeps every primitive it builds, one per product shape, in two caches (its own and ideep's,
torch's wrapper around it) of 1,024 entries each. A run's products change shape at every step
(the batch's token count), so with those defaults a process's memory grew by about 8 MiB a step
for the first hundreds of steps, and the heap around it by 40 (3.5M model, 30 steps: 663 to
1,855 MiB), each growth a slower update: the primitives kept between steps split the heap's free
space. `bound_primitive_caches` holds both to `CACHE_CAPACITY` entries, a pass's working set
(the same run: 180 MiB in use from the first step on, the heap at 813 MiB after 30 steps, below
the BLAS run's 931; the update's median 10% faster, 0.385 s against 0.426); importing this
module does it, before any product is built here.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from hflow.engine.kernels.transpose import in_rows

# Entries in each of oneDNN's primitive caches: a training pass builds about 15 shapes of product, a
# decoding step 6. 128 held the 27.5M model's run at 4,016 MiB, 32 at 3,247, 8 at 3,264, with the
# same step times (8 steps, 2026-11-27).
CACHE_CAPACITY = 32
CACHE_KEYS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's and ideep's


def bound_primitive_caches(environ=os.environ) -> None:
    """Bound oneDNN's two primitive caches (the caller's own value of a key wins). They read their
    capacity when they first build a primitive, so this must run before any oneDNN product."""
    for key in CACHE_KEYS:
        environ.setdefault(key, str(CACHE_CAPACITY))


bound_primitive_caches()


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (rows, in) @ weight (out, in)^T (+ bias) by oneDNN: (rows, out). Either operand may be a
    transposed view (oneDNN reads the strides)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def packed(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` (out, in) reordered into oneDNN's blocked layout for products of about `rows` rows:
    a copy, which `product` reads faster at a decoding step's rows (SmolLM2's 210 products of a
    step: 15.3-25.7 ms at 12-32 rows against 22.3-31.8 on the plain weights,
    `benchmarks/cpu_products.py`)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


def forward_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, onednn: bool) -> torch.Tensor:
    """y = x W^T (+ b) for x of any leading shape (..., in): by oneDNN or by F.linear."""
    return _rows_product(x, weight, bias) if onednn else F.linear(x, weight, bias)


def input_grad_product(grad: torch.Tensor, weight: torch.Tensor, onednn: bool) -> torch.Tensor:
    """dx = dy W for rows dy (rows, out): by oneDNN or by the BLAS."""
    return product(grad, weight.t()) if onednn else grad @ weight


def weight_grad_product(grad: torch.Tensor, rows: torch.Tensor, onednn: bool) -> torch.Tensor:
    """dW = dy^T x for rows dy (rows, out) and x (rows, in): by oneDNN or by the BLAS."""
    return product(in_rows(grad.t()), rows.t()) if onednn else grad.t() @ rows


def _rows_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`product` of an input of any leading shape (..., in): (..., out)."""
    return product(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])


def decodes_packed(weight: torch.Tensor) -> bool:
    """Whether the lean decoding step multiplies on weights reordered for oneDNN (`packed`): on a CPU
    wherever oneDNN runs, in float32 whichever library the training passes take (`routes`), in
    bfloat16 where oneDNN takes bf16 (AVX-512 and up; torch's own products run through oneDNN there
    too, but on the plain weights: SmolLM2's MLP product at 32 rows, cache cold, 96 us packed against
    131 as `weight @ x`, 16 rows 68 against 137; docs/benchmarks.md, "bfloat16 on a CPU that has it").

    A decoding step's thin products are not the training passes' wide ones, which `chosen_route`
    measures: on a 2-core AVX2 EPYC whose BLAS matches oneDNN on those (so the passes keep the
    BLAS), SmolLM2's products of a step (q/k/v and gate/up joined) took 27.7 / 35.2 / 44.1 / 66.6 ms
    packed at 1 / 8 / 16 / 32 rows against 36.2 / 69.7 / 50.0 / 78.1 by the BLAS's faster layout at
    each (`benchmarks/cpu_products.py`); on the AVX-512 EPYC, where the passes take oneDNN too,
    2.0-2.8x (docs/benchmarks.md)."""
    if weight.device.type != "cpu" or hasattr(weight, "ds_id") or not onednn_available():
        return False
    if weight.dtype == torch.bfloat16:
        return _onednn_takes_bf16()
    return weight.dtype == torch.float32


@functools.cache
def _onednn_takes_bf16() -> bool:
    """Whether torch's oneDNN runs bfloat16 products on this CPU (it refuses below AVX-512)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())
