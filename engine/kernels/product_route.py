"""Which library each kind of a layer's CPU products takes here, and the layers that take it.

oneDNN's products run faster than torch's BLAS on some CPUs and for some kinds of product only
(`cpu_products.py`). So every `nn.Linear` of a model hflow loads becomes a `RoutedLinear`
(`route_linears`): on a CPU in float32 each of its forward and backward products runs through
oneDNN (`cpu_products.product`) where that is the faster for its kind here, and through torch's own
(`F.linear`, `mm`) otherwise, and everywhere off that path (a GPU, bfloat16, ZeRO-3's partitioned
weights, whose gathering DeepSpeed ties to `F.linear`). The lean decoding step calls `product`
itself, on reordered weights, wherever oneDNN runs (`cpu_products.decodes_packed`: its thin
products run faster through oneDNN even where the passes' wide ones do not).

Which is faster is measured for each of a layer's three products (`KINDS`: the forward, the input
gradient and the weight gradient, at the shapes of an update's micro-batch, both ways, on one
thread: `faster_by`), and each takes oneDNN only where it is faster by more than the noise
(`MARGIN`): a route is a library per kind. The first run on a machine measures, and its answer is
kept in the user's cache for every later run there (`machine_choice`): where the two are close, a
measurement taken while another process was busy could go either way, and two runs of one recipe
and seed on one machine would then not give the same bits. Every process of a run, a resume
included, keeps the run's route (`settle`). `HFLOW_CPU_PRODUCTS=onednn|blas`, or three of those
words for the three kinds (`onednn,onednn,blas`), decides the passes' route instead (`auto`, the
default, takes the machine's).
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
from hflow.engine.kernels.cpu_products import forward_product, input_grad_product, onednn_available, weight_grad_product
from hflow.errors import UserError

log = logging.getLogger(__name__)

ENV = "HFLOW_CPU_PRODUCTS"
LIBRARIES = ("onednn", "blas")
KINDS = ("forward", "input_grad", "weight_grad")  # y = x W^T, dx = dy W, dW = dy^T x
# A kind takes oneDNN where its products take at most this share of the BLAS's time; within the
# margin either costs about as much, and the BLAS (torch's own) is kept. Which is faster differs by
# kind: on the 2-core AVX-512 EPYC of 2026-12-04, at an update's shapes (`PROBE_SHAPE`), oneDNN over
# the BLAS measured 0.86-0.93 for the forward, 0.84-0.92 for the input gradient and 0.96-1.01 for the
# weight gradient, on one thread and on two alike (`benchmarks/product_choice.py`). The measurement
# before (one 256 x 1,024 x 1,024 forward, oneDNN taken at 0.8) kept the BLAS for all three there
# (0.84-0.91), where the 27.5M model's update took 4.34 s against 3.91 with oneDNN, oneDNN, BLAS
# and its scoring pass 1.38 against 1.31 (`benchmarks/product_routes.py`, docs/benchmarks.md).
MARGIN = 0.95
# The shape the kinds are timed at: an update micro-batch's rows through SmolLM2's MLP, both ways
# round ((rows, 576) x (576, 1,536) and (rows, 1,536) x (1,536, 576)).
PROBE_ROWS, PROBE_SHAPE = 1024, (576, 1536)
# Each kind is timed on one thread, its two ways alternating over this many rounds, the best of
# each kept: which kernel is faster is the code's, not the team's, and a team of threads on a
# machine where another process holds a core waits for it at every product, each way by chance.
# With one spinning process beside it, on 2 threads the three ratios ranged 0.88-1.06, 0.78-1.08
# and 0.83-1.05 across measurements (each kind chosen both ways), on one thread 0.87-0.93,
# 0.86-0.92 and 0.96-0.97, as on an idle machine (2026-12-04; with one 256 x 1,024 x 1,024
# product, 2026-11-27: 0.18-2.07 on 2 threads, 0.25-0.48 on one).
PROBE_ROUNDS = 7


class ProductChoiceError(UserError):
    """HFLOW_CPU_PRODUCTS names no route."""


def parse_route(text: str) -> tuple[str, ...] | None:
    """A route as written (`HFLOW_CPU_PRODUCTS`, a run's record, the machine's): one library for
    all three kinds, or three comma-separated, in the order of `KINDS`; None where it is none."""
    words = tuple(w.strip() for w in text.strip().lower().split(","))
    if len(words) == 1:
        words *= len(KINDS)
    return words if len(words) == len(KINDS) and all(w in LIBRARIES for w in words) else None


def route_text(route: tuple[str, ...]) -> str:
    """A route written as `parse_route` reads it: one word where every kind takes the same library."""
    return route[0] if len(set(route)) == 1 else ",".join(route)


def _asked() -> str:
    """HFLOW_CPU_PRODUCTS as set, lower-cased; "auto" when unset or empty."""
    return os.environ.get(ENV, "auto").strip().lower() or "auto"


@functools.cache
def chosen_route() -> tuple[str, ...]:
    """The library of each of `KINDS` this process runs its CPU float32 products through (the module
    docstring)."""
    asked = _asked()
    route = None if asked == "auto" else parse_route(asked)
    if asked != "auto" and route is None:
        raise ProductChoiceError(f"environment {ENV}={os.environ[ENV]!r}: accepted values are auto, onednn, blas, "
                                 f"or one of onednn and blas for each of {', '.join(KINDS)} (onednn,onednn,blas)")
    if not onednn_available():
        return ("blas",) * len(KINDS)
    return route or machine_choice()


def through_onednn(kind: str) -> bool:
    return chosen_route()[KINDS.index(kind)] == "onednn"


def machine_choice() -> tuple[str, ...]:
    """`auto`'s route on this machine: the one the first run here measured, kept in
    `$XDG_CACHE_HOME/hflow/products` under the CPU's model and flags and torch's version.
    Where none is kept (or the record is damaged), measured now and kept; where two processes
    measure at once, the first to keep its answer wins and both take it. Where the cache cannot be
    used (not the user's own, not writable), measured for this process alone, said once."""
    measured = None
    try:
        path = user_cache.folder("products") / f"route-{_machine_key()}.json"
        kept = _read_choice(path)
        if kept is not None:
            return kept
        measured = _measured()
        return _kept_first(path, measured)
    except (user_cache.NotOwn, OSError) as err:
        log.info("the CPU product route is measured for this process, not kept for the machine: %s", err)
        return (measured or _measured())[0]


def _machine_key() -> str:
    """The CPU, torch, and how the route is measured and chosen."""
    key = "\n".join([user_cache.cpu_identity(), torch.__version__, str(MARGIN), str((PROBE_ROWS, PROBE_SHAPE))])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _measured() -> tuple[tuple[str, ...], dict[str, float]]:
    """(route, oneDNN's time over the BLAS's for each kind), timed now."""
    ratios = {kind: faster_by(kind) for kind in KINDS}
    return tuple("onednn" if ratios[kind] <= MARGIN else "blas" for kind in KINDS), ratios


def _read_choice(path: Path) -> tuple[str, ...] | None:
    """The route kept at `path`; None where there is none, or none that reads as one."""
    if not path.exists():
        return None
    user_cache.check_own(path)
    try:
        with path.open() as f:
            text = json.loads(f.read(4096)).get("route")
        route = parse_route(text) if isinstance(text, str) else None
    except (ValueError, AttributeError):
        route = None
    if route is None:
        log.info("%s holds no CPU product route: measured again", path)
    return route


def _kept_first(path: Path, measured: tuple[tuple[str, ...], dict[str, float]]) -> tuple[str, ...]:
    """Keep `measured` at `path` unless another process kept its own first; the kept route."""
    route, ratios = measured
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=".route-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"route": route_text(route), "kinds": list(KINDS),
                       "onednn_over_blas": {kind: round(r, 4) for kind, r in ratios.items()},
                       "torch": torch.__version__,
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
    return route


class Settled:
    """A run's route (`settle`); `restore()` gives the process back the environment it had before."""

    def __init__(self, choice: str, before: str | None):
        self.choice, self.before = choice, before

    def restore(self) -> None:
        if self.before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self.before
        chosen_route.cache_clear()


def settle(recorded: str | None = None) -> Settled:
    """Fix the route for the rest of a run, in this process and the processes it starts: the user's
    HFLOW_CPU_PRODUCTS, else `recorded` (the route the run took when it began, on a resume), else
    the machine's (`machine_choice`). `.choice` is the route as `route_text` writes it.

    The route goes into the environment, which this process's children inherit and Ray's workers
    are given (`groups/ray_backend.py`), so no other process of the run measures again. Two
    measurements on a loaded machine can disagree, and the two libraries sum in different orders
    (about 1e-6 of a result), so a resumed run would not continue to the bit, nor two data-parallel
    ranks agree. The run gives the environment back when it ends (`Settled.restore`): a later run
    in the same process, with a record of its own, is not held to this one's."""
    before = os.environ.get(ENV)
    kept = parse_route(recorded) if isinstance(recorded, str) else None
    if _asked() == "auto" and kept is not None:
        os.environ[ENV] = route_text(kept)
        chosen_route.cache_clear()
    choice = route_text(chosen_route())
    os.environ[ENV] = choice
    return Settled(choice, before)


def probe_ways(kind: str, rows: int = PROBE_ROWS, shape: tuple[int, int] = PROBE_SHAPE) -> list[tuple]:
    """(oneDNN's way, the BLAS's way) of `kind`'s product, the functions `_Linear` runs, on random
    float32 operands: one pair for each direction through an (in, out) = `shape` layer."""
    pairs = []
    for inner, outer in (shape, shape[::-1]):
        x, weight, grad = torch.randn(rows, inner), torch.randn(outer, inner), torch.randn(rows, outer)
        run = {"forward": functools.partial(forward_product, x, weight, None),
               "input_grad": functools.partial(input_grad_product, grad, weight),
               "weight_grad": functools.partial(weight_grad_product, grad, x)}[kind]
        pairs.append((functools.partial(run, onednn=True), functools.partial(run, onednn=False)))
    return pairs


def faster_by(kind: str, rows: int = PROBE_ROWS, shape: tuple[int, int] = PROBE_SHAPE,
              rounds: int = PROBE_ROUNDS, threads: int = 1) -> float:
    """oneDNN's time over the BLAS's for `kind`'s products (`probe_ways`) on `threads` threads (one
    for the route: why, above `PROBE_ROUNDS`): each way's best of `rounds`, the ways alternating,
    added over the pairs. The caller's thread count comes back afterwards."""
    ways = probe_ways(kind, rows, shape)
    best = [[float("inf")] * 2 for _ in ways]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for pair in ways:
            for way in pair:
                way()  # first calls: kernels built, memory touched
        for i in range(rounds):
            for pair, times in zip(ways, best):
                for j in ((0, 1) if i % 2 == 0 else (1, 0)):
                    start = time.perf_counter()
                    pair[j]()
                    times[j] = min(times[j], time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return sum(t[0] for t in best) / sum(t[1] for t in best)


def routes(weight: torch.Tensor) -> bool:
    """Whether any of the products with this weight runs through oneDNN here (`chosen_route`)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and not hasattr(weight, "ds_id")
            and "onednn" in chosen_route())


class _Linear(torch.autograd.Function):
    """F.linear with each of its three products through the library the route gives its kind
    (`chosen_route`, read once at the forward): y = x W^T + b, dx = dy W, dW = dy^T x."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        # The input itself is saved, as F.linear saves it: a non-contiguous one is copied into rows
        # only while a product needs them.
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.onednn = [library == "onednn" for library in chosen_route()]  # in the order of KINDS
        return forward_product(x, weight, bias, ctx.onednn[0])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rows = x.reshape(-1, x.shape[-1])
        grad = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = input_grad_product(grad, weight, ctx.onednn[1]).view(x.shape)
        if ctx.needs_input_grad[1]:
            dw = weight_grad_product(grad, rows, ctx.onednn[2])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = grad.sum(0)
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, each of its products through the library the route gives its kind (`chosen_route`)."""
    if not routes(weight) or x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    tracked = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and tracked:
        return _Linear.apply(x, weight, bias)
    return forward_product(x, weight, bias, through_onednn("forward"))


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
