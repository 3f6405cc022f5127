"""Which checkpoint a resume starts from: the newest complete one whose files verify.

A checkpoint is committed whole (`RunDir.commit_checkpoint`), yet its files can still be cut
or damaged afterwards: a machine that crashed before the page cache reached the disk, a copy
onto a full disk, a file edited by hand. Loading a large model's checkpoint to find that out
costs minutes, so the check reads only what proves each file whole:

- the COMPLETE marker lists every file's size at commit (`manifest`): a missing file, or one
  of another size, is found whatever its format;
- a JSON file parses;
- a safetensors file's header parses and the file is as long as the header says
  (`engine/models/safetensors_header.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from hflow.engine.models.safetensors_header import read_layout
from hflow.trainer.rundir.layout import COMPLETE, TRAINER_STATE


def manifest(checkpoint: Path) -> dict[str, int]:
    """Every file under `checkpoint` (but COMPLETE) by its relative path, with its size in bytes."""
    return {p.relative_to(checkpoint).as_posix(): p.stat().st_size
            for p in sorted(checkpoint.rglob("*")) if p.is_file() and p.name != COMPLETE}


def verify(checkpoint: Path) -> str | None:
    """None when `checkpoint` is whole, else why not, naming the file: for example
    `actor/weights.safetensors is truncated (1.2 MB of 3.4 MB)`."""
    listed, problem = _listed_sizes(checkpoint)
    if problem:
        return problem
    for name, size in listed.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} {_size_problem(path.stat().st_size, size)}"
    if not (checkpoint / TRAINER_STATE).is_file():
        return f"{TRAINER_STATE} is missing"
    for path in sorted(checkpoint.rglob("*")):
        check = {".json": _check_json, ".safetensors": _check_safetensors}.get(path.suffix)
        problem = check(path) if check and path.is_file() else None
        if problem:
            return f"{path.relative_to(checkpoint).as_posix()} {problem}"
    step = json.loads((checkpoint / TRAINER_STATE).read_text())
    if not isinstance(step, dict) or not isinstance(step.get("step"), int):
        return f'{TRAINER_STATE} has no integer "step"'
    return None


def newest_whole(checkpoints: list[Path], set_aside: Callable[[Path], str | None] | None = None
                 ) -> tuple[Path | None, list[str]]:
    """The newest of `checkpoints` (oldest first) that verifies, or None; and one line for each
    newer one skipped, saying why, where `set_aside` moved it (it returns the new place, or None
    when it could not move it) and where the run continues instead."""
    skipped = []
    chosen = None
    for checkpoint in reversed(checkpoints):
        problem = verify(checkpoint)
        if problem is None:
            chosen = checkpoint
            break
        moved = set_aside(checkpoint) if set_aside else None
        skipped.append((checkpoint, problem + (f" (moved to {moved} for inspection)" if moved else "")))
    then = f"resuming from {chosen.name}" if chosen else "no older checkpoint verifies: starting over from step 1"
    return chosen, [f"checkpoint {path.name} skipped: {problem}; {then}" for path, problem in skipped]


def _listed_sizes(checkpoint: Path) -> tuple[dict[str, int], str | None]:
    """The sizes COMPLETE recorded ({} for a checkpoint written before it recorded them)."""
    try:
        record = json.loads((checkpoint / COMPLETE).read_text())
    except (OSError, ValueError) as err:
        return {}, f"{COMPLETE} cannot be read ({_why(err)})"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict):
        return {}, None
    return {str(k): int(v) for k, v in files.items()}, None


def _check_json(path: Path) -> str | None:
    try:
        json.loads(path.read_bytes())
    except (OSError, ValueError) as err:
        return f"is not valid JSON ({_why(err)})"
    return None


def _check_safetensors(path: Path) -> str | None:
    try:
        layout = read_layout(path)
    except OSError as err:
        return f"has an unreadable header ({_why(err)})"
    if layout.size < 8 or layout.header_end > layout.size:
        return f"is truncated ({_bytes(layout.size)}; its header alone needs {_bytes(layout.header_end)})"
    if layout.data_end is None:
        return f"has an unreadable header ({layout.unreadable})"
    return None if layout.size == layout.data_end else _size_problem(layout.size, layout.data_end)


def _size_problem(size: int, want: int) -> str:
    if size < want:
        return f"is truncated ({_bytes(size, want)} of {_bytes(want, size)})"
    return f"is longer than written ({_bytes(size, want)}, not {_bytes(want, size)})"


def _bytes(n: int, other: int | None = None) -> str:
    """`n` bytes for people (decimal units); exact when rounding would make it equal `other`."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            text = f"{n / scale:.1f} {unit}"
            return f"{n} B" if other is not None and text == _bytes(other) else text
    return f"{n} B"


def _why(err: Exception) -> str:
    if isinstance(err, OSError):
        return err.strerror or str(err)
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} at byte {err.pos}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__
