"""Rows of one step that arrived in chunks, put back together as one Batch.

A streamed step (`trainer/streaming/chunks.py`) generates and scores its rollout chunk by
chunk; each chunk is padded to its own widest prompt (P_k) and response (R_k). Joining them
pads every chunk to the widest of all (prompts on the left, responses on the right, as
`columns.py` lays them out) and concatenates the rows in chunk order. Padding is cut again
before any compute (`training/packing.py`), so a chunk's rows score the same either way.
"""

from __future__ import annotations

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.padding import pad_rollout, positions


def widths(batch: Batch) -> tuple[int, int]:
    """(P, R): the batch's prompt and response widths."""
    width_r = batch[col.RESPONSE_MASK].shape[1]
    return batch[col.ATTENTION_MASK].shape[1] - width_r, width_r


def widen(batch: Batch, width_p: int, width_r: int, pad_token_id: int) -> Batch:
    """`batch` padded to prompt width `width_p` and response width `width_r` (no narrower than it
    is) by `pad_rollout`, with the position ids counted again on the wider mask, as the generator
    counts them."""
    own_p, own_r = widths(batch)
    if width_p < own_p or width_r < own_r:
        raise ValueError(f"cannot narrow a batch of widths ({own_p}, {own_r}) to ({width_p}, {width_r})")
    if (width_p, width_r) == (own_p, own_r):
        return batch
    tensors = pad_rollout(dict(batch.tensors), width_p, width_r, pad_token_id)
    if col.POSITION_IDS in tensors:
        tensors[col.POSITION_IDS] = positions(tensors[col.ATTENTION_MASK])
    return Batch(tensors, dict(batch.columns), dict(batch.meta))


def join_rows(chunks: list[Batch], pad_token_id: int) -> Batch:
    """The chunks' rows in order as one Batch, padded to their widest prompt and response. Every
    chunk must carry the same columns (a chunk missing one was not through every stage)."""
    if not chunks:
        raise ValueError("no chunks to join")
    keys = set(chunks[0].keys())
    for k, chunk in enumerate(chunks[1:], 1):
        if set(chunk.keys()) != keys:
            raise ValueError(f"chunk {k} has columns {sorted(chunk.keys())}, chunk 0 {sorted(keys)}")
    if col.RESPONSE_MASK not in keys:  # no rollout columns: nothing to widen
        return Batch.concat(chunks)
    all_widths = [widths(c) for c in chunks]
    width_p, width_r = max(w[0] for w in all_widths), max(w[1] for w in all_widths)
    return Batch.concat(widen(c, width_p, width_r, pad_token_id) for c in chunks)
