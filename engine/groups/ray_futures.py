"""Results of the `ray` backend's worker calls, left in Ray's object store until read.

A call returns a `Future`: per rank, the object refs of the pieces whose union is that rank's
share (`Part`). Passed to another group's call, each of its ranks fetches its own piece from
the store; the controller pulls data only when it reads a column (`future["scores"]`, read
where the piece lives) or the whole value (`future.get()`). A worker that raised, died or gave
no answer within the watchdog's time becomes a `WorkerError` naming its role, rank and call
(`ray_watchdog.py`).
A streamed step's chunks stay chunks there (`ChunkedFuture`): a call over them answers with
pieces covering every chunk, and each chunk keeps its rows of those pieces (`Cut`), so the
rows never come to the controller to be joined.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch
from hflow.engine.groups.ray_watchdog import get_parts, ray_module
from hflow.engine.groups.rows import join_rows, widths


class RefParts:
    """One rank's share of a future: object refs whose Batches are unioned on arrival, each first
    cut to its rows where it has a `Cut`."""

    def __init__(self, refs: list, cuts: list | None = None):
        self.refs = refs
        self.cuts = cuts or [None] * len(refs)


@dataclass(frozen=True)
class Cut:
    """Rows [start, stop) of a piece computed over several chunks' rows at once (a DP call on a
    `ChunkedFuture`), with its per-response-token columns (`joined_r` wide) cut back to the
    chunk's response width: that chunk's share of the result, left in the store until read."""

    start: int
    stop: int
    width_r: int
    joined_r: int

    def apply(self, batch: Batch) -> Batch:
        rows = batch.slice(self.start, self.stop)
        return Batch({k: t[:, :self.width_r] if t.dim() >= 2 and t.shape[1] == self.joined_r else t
                      for k, t in rows.tensors.items()}, rows.columns, rows.meta)


def cut(batch: Batch, how: Cut | None) -> Batch:
    return batch if how is None else how.apply(batch)


def union_all(batches: list[Batch]) -> Batch:
    out = batches[0]
    for b in batches[1:]:
        out = out | b
    return out


class RowBlocks:
    """One rank's share of a `ChunkedFuture`: per chunk, that rank's `RefParts`; their rows are
    joined in chunk order on arrival (`rows.join_rows`)."""

    def __init__(self, blocks: list[RefParts], pad_token_id: int):
        self.blocks = blocks
        self.pad_token_id = pad_token_id


def unpack(value: Any) -> Any:
    if isinstance(value, RefParts):
        ray = ray_module()
        return union_all([cut(b, c) for b, c in zip(ray.get(value.refs), value.cuts)])
    if isinstance(value, RowBlocks):
        return join_rows([unpack(block) for block in value.blocks], value.pad_token_id)
    return value


@dataclass
class Part:
    """One piece of a rank's share: an object ref, who made it, and (for the controller's own
    pieces) the value itself, so reading it back costs nothing."""

    ref: Any
    role: str
    rank: int
    handle: Any = None  # the fused worker that produced it; None for the controller's
    local: Batch | None = None
    call: str = ""  # the worker method that produces it, for the watchdog's line
    timeout_s: float | None = None  # how long the controller waits for it (the watchdog)
    cut: Cut | None = None  # only these rows of the piece are this part (`ChunkedFuture.__or__`)
    deps: tuple = ()  # the parts its call read (`ray_watchdog`: whom a stall or failure is blamed on)


def _controller_parts(batch: Batch, world: int) -> list[Part]:
    ray = ray_module()
    return [Part(ray.put(piece), "controller", r, local=piece) for r, piece in enumerate(batch.chunk(world))]


class Future:
    """The pending result of a group call: per-rank parts plus how to gather them."""

    __hflow_future__ = True

    def __init__(self, parts: list[list[Part]], collect):
        self.parts = parts  # parts[rank] = the pieces whose union is that rank's share
        self.collect = collect
        self._columns: dict[str, Any] = {}
        self._value = None

    @property
    def world_size(self) -> int:
        return len(self.parts)

    def wait(self, timeout_s: float) -> bool:
        """Whether every piece is computed, waiting at most `timeout_s` (nothing is fetched; a
        failed piece counts as computed, and raises when read)."""
        refs = [part.ref for rank_parts in self.parts for part in rank_parts if part.local is None]
        ready, _ = ray_module().wait(refs, num_returns=len(refs), timeout=timeout_s, fetch_local=False)
        return len(ready) == len(refs)

    def rank_refs(self, rank: int) -> RefParts:
        return RefParts([part.ref for part in self.parts[rank]], [part.cut for part in self.parts[rank]])

    def rank_parts(self, rank: int) -> list[Part]:
        """The parts a call on rank `rank` reads when handed this future (`rank_refs`)."""
        return self.parts[rank]

    def get(self) -> Any:
        if self._value is None:
            flat = get_parts([p for rank_parts in self.parts for p in rank_parts])
            per_rank, start = [], 0
            for rank_parts in self.parts:
                values, start = flat[start:start + len(rank_parts)], start + len(rank_parts)
                per_rank.append([cut(v, p.cut) for v, p in zip(values, rank_parts)])
            if isinstance(per_rank[0][0], Batch):
                self._value = Batch.concat(union_all(p) for p in per_rank)
            else:
                self._value = self.collect([p[0] for p in per_rank])
        return self._value

    def select(self, *keys: str) -> Batch:
        """These columns as a Batch. Each worker that produced a piece reads its columns where
        the piece lives, so the rest of the batch never travels to the controller."""
        if self._value is not None:
            return self._value.select(*keys)
        missing = [k for k in keys if k not in self._columns]
        if missing:
            local, reads = [], []  # per rank: the controller's own pieces; reads where the rest live
            for rank_parts in self.parts:
                local.append([cut(p.local, p.cut).select(*missing) for p in rank_parts if p.local is not None])
                by_handle: dict[int, list[Part]] = {}
                for p in rank_parts:
                    if p.local is None:
                        by_handle.setdefault(id(p.handle), []).append(p)
                reads.append([_read(group, missing) for group in by_handle.values()])
            values = iter(get_parts([read for rank_reads in reads for read in rank_reads]))
            fetched = Batch.concat(union_all(own + [next(values) for _ in rank_reads])
                                   for own, rank_reads in zip(local, reads))
            for key in fetched.keys():
                self._columns[key] = fetched[key]
        found = {k: self._columns[k] for k in keys if k in self._columns}
        return Batch({k: v for k, v in found.items() if isinstance(v, torch.Tensor)},
                     {k: v for k, v in found.items() if not isinstance(v, torch.Tensor)})

    def __getitem__(self, key: str) -> Any:
        view = self.select(key)
        if key not in view:
            raise KeyError(f"no field {key!r} in the batch")
        return view[key]

    def __contains__(self, key: str) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __len__(self) -> int:
        return len(self[col.RESPONSE_MASK]) if self._value is None else len(self._value)

    def __or__(self, other: "Future | Batch") -> "Future":
        if isinstance(other, Batch):
            extra = [[part] for part in _controller_parts(other, self.world_size)]
        elif other.world_size == self.world_size and not isinstance(other, ChunkedFuture):
            extra = other.parts
        else:
            return _as_future(self.get() | other.get(), 1)
        return Future([mine + theirs for mine, theirs in zip(self.parts, extra)], self.collect)

    def __ror__(self, other: Batch) -> "Future":
        mine = _controller_parts(other, self.world_size)
        return Future([[part] + rest for part, rest in zip(mine, self.parts)], self.collect)


class ChunkedFuture(Future):
    """The rows of several futures of one group's world size, in order: a streamed step's chunks
    (`trainer/streaming/chunks.py`), joined without leaving the object store. Handed to a
    group's DP call, each rank receives its piece of every chunk (`RowBlocks`) and joins them
    itself; the controller reads only the columns it asks for."""

    def __init__(self, chunks: list[Future], pad_token_id: int):
        if len({c.world_size for c in chunks}) != 1:
            raise ValueError("chunks of different world sizes cannot be joined")
        super().__init__([], chunks[0].collect)
        # A chunk of chunks is its chunks: the same rows in the same order, at the widest widths.
        self.chunks = [leaf for c in chunks for leaf in (c.chunks if isinstance(c, ChunkedFuture) else [c])]
        self.pad_token_id = pad_token_id
        self._widths: list[tuple[int, int]] | None = None

    @property
    def world_size(self) -> int:
        return self.chunks[0].world_size

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(c.wait(max(0.0, deadline - time.monotonic())) for c in self.chunks)

    def rank_refs(self, rank: int) -> RowBlocks:
        return RowBlocks([c.rank_refs(rank) for c in self.chunks], self.pad_token_id)

    def rank_parts(self, rank: int) -> list[Part]:
        return [p for c in self.chunks for p in c.rank_parts(rank)]

    def get(self) -> Batch:
        if self._value is None:
            self._value = join_rows([c.get() for c in self.chunks], self.pad_token_id)
        return self._value

    def select(self, *keys: str) -> Batch:
        """These columns of every chunk, joined (the masks come along to pad per-token columns)."""
        if self._value is not None:
            return self._value.select(*keys)
        masks = tuple(k for k in (col.ATTENTION_MASK, col.RESPONSE_MASK) if k not in keys)
        joined = join_rows([c.select(*keys, *masks) for c in self.chunks], self.pad_token_id)
        return joined.select(*keys)

    def __len__(self) -> int:
        return sum(len(c) for c in self.chunks)

    def chunk_widths(self) -> list[tuple[int, int]]:
        if self._widths is None:
            self._widths = [widths(c.select(col.ATTENTION_MASK, col.RESPONSE_MASK)) for c in self.chunks]
        return self._widths

    def __or__(self, other: "Future | Batch") -> "ChunkedFuture":
        """With a Batch of the joined rows (the controller's advantages): each chunk gets its rows,
        per-token columns cut back to the chunk's response width (the rest is padding). With the
        future of a DP call over these rows (old log-probs), each chunk gets its `Cut` of every
        rank's piece, which stays in the store."""
        if isinstance(other, Future) and not isinstance(other, ChunkedFuture) and other.world_size == self.world_size:
            return self._with_result(other)
        if not isinstance(other, Batch):
            return _as_future(self.get() | other.get(), 1)
        joined_r = max(r for _, r in self.chunk_widths())
        out, start = [], 0
        for chunk, (_, width_r) in zip(self.chunks, self.chunk_widths()):
            rows = other.slice(start, start + len(chunk))
            start += len(chunk)
            rows = Batch({k: t[:, :width_r] if t.dim() >= 2 and t.shape[1] == joined_r else t
                          for k, t in rows.tensors.items()}, rows.columns, rows.meta)
            out.append(chunk | rows)
        return ChunkedFuture(out, self.pad_token_id)

    def _with_result(self, result: Future) -> "ChunkedFuture":
        """Rank r of a DP call on this future joined its piece of every chunk in order (`RowBlocks`),
        each piece len(chunk) / world rows, every rank at the same widths (`rollout_batch`)."""
        world, joined_r = self.world_size, max(r for _, r in self.chunk_widths())
        out, start = [], 0
        for chunk, (_, width_r) in zip(self.chunks, self.chunk_widths()):
            how = Cut(start, start + len(chunk) // world, width_r, joined_r)
            start = how.stop
            out.append(Future([own + [replace(p, cut=how) for p in theirs]
                               for own, theirs in zip(chunk.parts, result.parts)], chunk.collect))
        return ChunkedFuture(out, self.pad_token_id)

    def __ror__(self, other: Batch) -> "ChunkedFuture":
        raise TypeError("join a Batch onto a ChunkedFuture from its right: chunked | batch")


def _read(group: list[Part], keys: list[str]) -> Part:
    """The columns `keys` of these pieces, read by the worker that holds them: a part of its own,
    which depends on them (a failed or stalled piece is named, not the read)."""
    first = group[0]
    ref = first.handle.read.remote([p.ref for p in group], keys, [p.cut for p in group])
    return Part(ref, first.role, first.rank, first.handle, call=f"{first.call} (reading its result)",
                timeout_s=first.timeout_s, deps=tuple(group))


def _as_future(batch: Batch, world: int) -> Future:
    return Future([[part] for part in _controller_parts(batch, world)], Dispatch.DP_COMPUTE.collect)
