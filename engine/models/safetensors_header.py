"""Where a safetensors file's parts end, read from its header alone (no tensor is loaded).

The format (https://huggingface.co/docs/safetensors, "Format"): 8 bytes, a little-endian u64 N;
N bytes of JSON mapping each tensor name to its dtype, shape and `data_offsets` [begin, end)
into the data that follows (plus an optional `__metadata__`); the file ends where the last
tensor's data ends. A model folder's check (`folder.py`) and a checkpoint's (`trainer/rundir/
checkpoints.py`) both read it here and put what they find in their own words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple


class Layout(NamedTuple):
    size: int  # bytes on disk
    header_end: int  # 8 + the header's stated length N (8 for a file shorter than that)
    data_end: int | None  # the file's length by its header; None when the header was not read whole
    unreadable: str | None  # why the header is not safetensors JSON; None when it is, or was not read


def read_layout(path: Path) -> Layout:
    """The layout of the safetensors file `path`. The header is read only when the file holds
    all of it, so a damaged length never makes this read a huge block."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return Layout(size, 8, None, None)
        header_end = 8 + int.from_bytes(head, "little")
        if header_end > size:
            return Layout(size, header_end, None, None)
        raw = f.read(header_end - 8)
    try:
        header = json.loads(raw)
    except ValueError as err:
        why = f"{err.msg} at byte {err.pos}" if isinstance(err, json.JSONDecodeError) else str(err).splitlines()[0]
        return Layout(size, header_end, None, why)
    try:
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (AttributeError, KeyError, TypeError, IndexError, ValueError):
        return Layout(size, header_end, None, "a tensor without data_offsets")
    return Layout(size, header_end, header_end + max(ends, default=0), None)
