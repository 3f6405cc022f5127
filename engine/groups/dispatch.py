"""Transfer protocols: how a worker method's arguments reach a group's ranks and come back.

A worker method is marked `@register(dispatch=Dispatch.DP_COMPUTE)`; the WorkerGroup
then splits the controller's Batch across the data-parallel ranks, calls every rank,
and concatenates the ranks' results in rank order (HybridFlow Section 4.2: the
protocol is declared once on the method, so the controller program never splits or
gathers data itself). New protocols are added with `add_protocol`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from hflow.engine import work_meter
from hflow.engine.groups.batch import Batch

DISPATCH_ATTR = "__hflow_dispatch__"


@dataclass(frozen=True)
class Protocol:
    """split(args, kwargs, world) -> per-rank (args, kwargs); collect(results) -> one result."""

    name: str
    split: Callable[[tuple, dict, int], list[tuple[tuple, dict]]]
    collect: Callable[[list], Any]


def _one_to_all(args: tuple, kwargs: dict, world: int) -> list[tuple[tuple, dict]]:
    return [(args, kwargs)] * world


def _split_batches(args: tuple, kwargs: dict, world: int) -> list[tuple[tuple, dict]]:
    """Every Batch argument in `world` equal consecutive pieces, also inside dicts, lists and
    tuples (nested fields); other values go to every rank as they are."""

    def pieces(value):
        if isinstance(value, Batch):
            if len(value) % world:
                raise ValueError(
                    f"a batch of {len(value)} rows cannot be split evenly over {world} data-parallel "
                    f"ranks; use a batch size that is a multiple of {world}"
                )
            return value.chunk(world)
        if isinstance(value, dict):
            split = {k: pieces(v) for k, v in value.items()}
            return [{k: v[r] for k, v in split.items()} for r in range(world)]
        if isinstance(value, (list, tuple)):
            split = [pieces(v) for v in value]
            return [type(value)(v[r] for v in split) for r in range(world)]
        return [value] * world

    split_args = [pieces(a) for a in args]
    split_kwargs = {k: pieces(v) for k, v in kwargs.items()}
    return [
        (tuple(a[r] for a in split_args), {k: v[r] for k, v in split_kwargs.items()})
        for r in range(world)
    ]


def _concat(results: list) -> Any:
    """Rank results in rank order: Batches concatenated (also inside dicts, lists and tuples),
    metric dicts of numbers averaged."""
    first = results[0]
    if isinstance(first, Batch):
        return Batch.concat(results)
    if isinstance(first, dict):
        if all(isinstance(v, (int, float)) for v in first.values()):
            return _mean_metrics(results)
        return {k: _concat([r[k] for r in results]) for k in first}
    if isinstance(first, (list, tuple)) and first and any(isinstance(v, (Batch, dict)) for v in first):
        return type(first)(_concat([r[i] for r in results]) for i in range(len(first)))
    return results


def _mean_metrics(results: list[dict]) -> dict:
    """Per-rank metric dicts averaged key by key (each rank saw an equal share of the data)."""
    keys = results[0].keys()
    return {k: sum(r[k] for r in results) / len(results) for k in keys}


class Dispatch:
    ONE_TO_ALL = Protocol("one_to_all", _one_to_all, lambda results: results)
    RANK_ZERO = Protocol("rank_zero", _one_to_all, lambda results: results[0])
    DP_COMPUTE = Protocol("dp_compute", _split_batches, _concat)
    # RANK_ZERO's value, but on the ray backend it stays in the object store (a future of rank 0's
    # result, the other ranks' checked for errors): handed to another group's ONE_TO_ALL call, each
    # of that group's ranks fetches it from the store, and the controller never holds it.
    RANK_ZERO_FUTURE = Protocol("rank_zero_future", _one_to_all, lambda results: results[0])


def add_protocol(name: str, split, collect) -> Protocol:
    """A new transfer protocol, available as `Dispatch.<NAME>`."""
    protocol = Protocol(name, split, collect)
    setattr(Dispatch, name.upper(), protocol)
    return protocol


def register(dispatch: Protocol) -> Callable:
    """Mark a worker method with the protocol its WorkerGroup uses to call it. A method that
    computes a phase of the RL step (`work_meter.PHASES`) counts its models' work under that
    phase, under `eval` when its batch is an evaluation's (`meta["eval"]`), and under the phase
    of its batch's step when it runs ahead of that step (`work_meter.AHEAD`)."""

    def mark(method: Callable) -> Callable:
        phase = work_meter.PHASES.get(method.__name__)

        @functools.wraps(method)
        def inner(*args, **kwargs):
            if phase is None:
                return method(*args, **kwargs)
            batch = args[1] if len(args) > 1 and isinstance(args[1], Batch) else None
            counted = phase
            if batch is not None and batch.meta.get("eval"):
                counted = work_meter.EVAL
            elif batch is not None and method.__name__ in work_meter.AHEAD and "step" in batch.meta:
                counted = work_meter.for_step(phase, int(batch.meta["step"]))
            with work_meter.working_on(counted):
                return method(*args, **kwargs)

        setattr(inner, DISPATCH_ATTR, dispatch)
        return inner

    return mark


def protocol_of(method: Callable) -> Protocol | None:
    return getattr(method, DISPATCH_ATTR, None)
