"""Rows of one step that arrived in chunks, put back together as one Batch.

A streamed step (`trainer/control/streaming.py`) generates and scores its rollout chunk by
chunk; each chunk is padded to its own widest prompt (P_k) and response (R_k). Joining them
pads every chunk to the widest of all (prompts on the left, responses on the right, as
`columns.py` lays them out) and concatenates the rows in chunk order. Padding is cut again
before any compute (`training/packing.py`), so a chunk's rows score the same either way.
"""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.rollout.assembly import positions

# Columns of width P + R (prompt and response), padded on both sides.
SEQUENCE_COLUMNS = (col.INPUT_IDS, col.ATTENTION_MASK, col.POSITION_IDS)
# Columns of width R whose padding is the pad token, not 0.
TOKEN_COLUMNS = (col.RESPONSES,)


def widths(batch: Batch) -> tuple[int, int]:
    """(P, R): the batch's prompt and response widths."""
    width_r = batch[col.RESPONSE_MASK].shape[1]
    return batch[col.ATTENTION_MASK].shape[1] - width_r, width_r


def widen(batch: Batch, width_p: int, width_r: int, pad_token_id: int) -> Batch:
    """`batch` padded to prompt width `width_p` and response width `width_r` (no narrower than it is)."""
    own_p, own_r = widths(batch)
    left, right = width_p - own_p, width_r - own_r
    if left < 0 or right < 0:
        raise ValueError(f"cannot narrow a batch of widths ({own_p}, {own_r}) to ({width_p}, {width_r})")
    if left == right == 0:
        return batch
    tensors = {}
    for key, t in batch.tensors.items():
        fill = pad_token_id if key in (col.INPUT_IDS, *TOKEN_COLUMNS) else 0
        if key in SEQUENCE_COLUMNS:
            tensors[key] = torch.nn.functional.pad(t, (left, right), value=fill)
        elif t.dim() >= 2 and t.shape[1] == own_r:  # per-token columns: (N, R)
            tensors[key] = torch.nn.functional.pad(t, (0, right), value=fill)
        else:
            tensors[key] = t
    if col.POSITION_IDS in tensors:  # counted again on the wider mask, as the generator counts them
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
