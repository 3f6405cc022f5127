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

So every `nn.Linear` of a model hflow loads becomes a `RoutedLinear` (`route_linears`): on a CPU
in float32 its forward and backward products run through `product` when oneDNN is the faster here,
and through `F.linear` otherwise (a GPU, bfloat16, ZeRO-3's partitioned weights, whose gathering
DeepSpeed ties to `F.linear`). The lean decoding step calls `product` itself, on reordered weights,
wherever oneDNN runs (`decodes_packed`: its thin products run faster through oneDNN even where the
passes' wide ones do not).

Which is faster is measured on a product of a typical shape, both ways, on one thread
(`faster_by`); oneDNN is taken only when clearly faster (`MARGIN`). The first run on a machine
measures, and its answer is kept in the user's cache for every later run there (`machine_choice`):
where the two are close, a measurement taken while another process was busy could go either way,
and two runs of one recipe and seed on one machine would then not give the same bits. Every process
of a run, a resume included, keeps the run's choice (`settle`). `HFLOW_CPU_PRODUCTS=onednn|blas`
decides the passes' route instead (`auto`, the default, takes the machine's).

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
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hflow.engine import user_cache
from hflow.errors import UserError

log = logging.getLogger(__name__)

ENV = "HFLOW_CPU_PRODUCTS"
CHOICES = ("auto", "onednn", "blas")
# oneDNN is chosen when its product takes at most this share of the BLAS's time: measured 0.45 on
# the development machine; a CPU where the two are close keeps the BLAS (and the same choice in
# every process of a run, measured apart).
MARGIN = 0.8
# The two are timed on one thread: which kernel is faster is the code's, not the team's, and a
# team of threads on a machine where another process holds a core waits for it at every product,
# each way by chance. On the development machine (2 cores), one spinning process beside it, the
# ratio timed on 2 threads ranged 0.18-2.07 across processes (the BLAS chosen in some), on one
# thread 0.25-0.48; idle 0.46-0.48 and 0.45-0.46 (`benchmarks/product_choice.py`, 2026-11-27).
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


class ProductChoiceError(UserError):
    """HFLOW_CPU_PRODUCTS names no choice."""


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


def _asked() -> str:
    """HFLOW_CPU_PRODUCTS as set, lower-cased; "auto" when unset or empty."""
    return os.environ.get(ENV, "auto").strip().lower() or "auto"


@functools.cache
def onednn_chosen() -> bool:
    """Whether this process runs its CPU float32 products through oneDNN (see the module docstring)."""
    choice = _asked()
    if choice not in CHOICES:
        raise ProductChoiceError(f"environment {ENV}={os.environ[ENV]!r}: accepted values are {', '.join(CHOICES)}")
    if choice == "blas" or not onednn_available():
        return False
    return choice == "onednn" or machine_choice() == "onednn"


def machine_choice() -> str:
    """`auto`'s route on this machine, "onednn" or "blas": the one the first run here measured,
    kept in `$XDG_CACHE_HOME/hflow/products` under the CPU's model and flags and torch's version.
    Where none is kept (or the record is damaged), measured now and kept; where two processes
    measure at once, the first to keep its answer wins and both take it. Where the cache cannot be
    used (not the user's own, not writable), measured for this process alone, said once."""
    measured = None
    try:
        path = user_cache.folder("products") / f"choice-{_machine_key()}.json"
        kept = _read_choice(path)
        if kept is not None:
            return kept
        measured = _measured()
        return _kept_first(path, measured)
    except (user_cache.NotOwn, OSError) as err:
        log.info("the CPU product route is measured for this process, not kept for the machine: %s", err)
        return (measured or _measured())[0]


def _machine_key() -> str:
    key = "\n".join([user_cache.cpu_identity(), torch.__version__, str(MARGIN)])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _measured() -> tuple[str, float]:
    ratio = faster_by(product, F.linear)
    return ("onednn" if ratio <= MARGIN else "blas"), ratio


def _read_choice(path: Path) -> str | None:
    """The route kept at `path`; None where there is none, or none that reads as one."""
    if not path.exists():
        return None
    user_cache.check_own(path)
    try:
        with path.open() as f:
            choice = json.loads(f.read(4096)).get("choice")
    except (ValueError, AttributeError):
        choice = None
    if choice not in CHOICES[1:]:
        log.info("%s holds no CPU product route: measured again", path)
        return None
    return choice


def _kept_first(path: Path, measured: tuple[str, float]) -> str:
    """Keep `measured` at `path` unless another process kept its own first; the kept route."""
    choice, ratio = measured
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=".choice-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"choice": choice, "onednn_over_blas": round(ratio, 4), "torch": torch.__version__,
                       "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
        try:
            os.link(partial, path)  # never over another process's record
        except FileExistsError:
            kept = _read_choice(path)
            if kept is not None:
                return kept
            os.replace(partial, path)  # a damaged record: ours instead
    finally:
        Path(partial).unlink(missing_ok=True)
    return choice


class Settled:
    """A run's choice (`settle`); `restore()` gives the process back the environment it had before."""

    def __init__(self, choice: str, before: str | None):
        self.choice, self.before = choice, before

    def restore(self) -> None:
        if self.before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self.before
        onednn_chosen.cache_clear()


def settle(recorded: str | None = None) -> Settled:
    """Fix the choice for the rest of a run, in this process and the processes it starts: the user's
    HFLOW_CPU_PRODUCTS, else `recorded` (the choice the run made when it began, on a resume), else
    the machine's (`machine_choice`). `.choice` is "onednn" or "blas".

    The choice goes into the environment, which this process's children inherit and Ray's workers
    are given (`groups/ray_backend.py`), so no other process of the run measures again. Two
    measurements on a loaded machine can disagree, and the two routes sum in different orders (about
    1e-6 of a result), so a resumed run would not continue to the bit, nor two data-parallel ranks
    agree. The run gives the environment back when it ends (`Settled.restore`): a later run in the
    same process, with a record of its own, is not held to this one's."""
    before = os.environ.get(ENV)
    if _asked() == "auto" and recorded in CHOICES[1:]:
        os.environ[ENV] = recorded
        onednn_chosen.cache_clear()
    choice = "onednn" if onednn_chosen() else "blas"
    os.environ[ENV] = choice
    return Settled(choice, before)


def faster_by(candidate, reference, rows: int = 256, size: int = 1024, threads: int = 1) -> float:
    """candidate's best time over reference's on a (rows, size) x (size, size) float32 product,
    rounds alternating, on `threads` threads (one for the choice: why, above `MARGIN`)."""
    x, weight = torch.randn(rows, size), torch.randn(size, size)
    best = {candidate: float("inf"), reference: float("inf")}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for f in best:
            f(x, weight)  # first calls: kernels built, memory touched
        for _ in range(5):
            for f in best:
                start = time.perf_counter()
                f(x, weight)
                best[f] = min(best[f], time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return best[candidate] / best[reference]


def _rows_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`product` of an input of any leading shape (..., in): (..., out)."""
    return product(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])


def routes(weight: torch.Tensor) -> bool:
    """Whether a product with this weight runs through oneDNN here."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and not hasattr(weight, "ds_id")
            and onednn_chosen())


def decodes_packed(weight: torch.Tensor) -> bool:
    """Whether the lean decoding step multiplies on weights reordered for oneDNN (`packed`): on a CPU
    wherever oneDNN runs, in float32 whichever library the training passes take (`routes`), in
    bfloat16 where oneDNN takes bf16 (AVX-512 and up; torch's own products run through oneDNN there
    too, but on the plain weights: SmolLM2's MLP product at 32 rows, cache cold, 96 us packed against
    131 as `weight @ x`, 16 rows 68 against 137; docs/benchmarks.md, "bfloat16 on a CPU that has it").

    A decoding step's thin products are not the training passes' wide ones, which `onednn_chosen`
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


class _Linear(torch.autograd.Function):
    """F.linear with its three products through oneDNN: y = x W^T + b, dx = dy W, dW = dy^T x."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        # The input itself is saved, as F.linear saves it: a non-contiguous one is copied into rows
        # only while a product needs them.
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _rows_product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rows = x.reshape(-1, x.shape[-1])
        grad = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = product(grad, weight.t()).view(x.shape)
        if ctx.needs_input_grad[1]:
            dw = product(grad.t(), rows.t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = grad.sum(0)
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, its products through oneDNN where `routes` says so."""
    if not routes(weight) or x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    tracked = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and tracked:
        return _Linear.apply(x, weight, bias)
    return _rows_product(x, weight, bias)


class RoutedLinear(nn.Linear):
    """An nn.Linear whose forward is `linear` (the same parameters, hooks and state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def route_linears(model: nn.Module) -> int:
    """Make every plain nn.Linear of `model` a RoutedLinear, in place; returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = RoutedLinear
            count += 1
    return count
