"""Read a run directory written by `hflow train`, while it is being written.

`hflow monitor`, `hflow runs` and any later analysis read the same files
(DESIGN.md, "Runs"): ``status.json``, ``events.jsonl``, ``samples.jsonl``,
``plan.json``, ``recipe.yaml`` and ``train.log``. The views stay thin; the
file handling lives here, once:

* ``LineTail`` follows a growing file from a byte offset. A refresh reads
  only the bytes appended since the last one (a 100,000-step run costs the
  same per refresh as a 10-step one), and a half-written last line is held
  back until its newline arrives.
* ``MetricTable`` keeps one float column per metric key, aligned by row
  (one row per step), so charts slice arrays instead of re-walking dicts.
* ``read_status`` applies the crashed-process rule: ``running`` with a pid
  that is gone on this host is shown as ``failed``.
"""

from __future__ import annotations

import json
import math
import os
import socket
from array import array
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import yaml

EVENTS = "events.jsonl"
SAMPLES = "samples.jsonl"
STATUS = "status.json"
PLAN = "plan.json"
RECIPE = "recipe.yaml"
LOG = "train.log"
RUN_FILES = (STATUS, EVENTS, RECIPE)
NAN = math.nan


class RunDirError(Exception):
    """A user-facing problem with a run directory: the message names the path."""


# --------------------------------------------------------------------------- tails


class LineTail:
    """Follow a growing text file, returning only complete lines.

    ``offset`` is the byte position up to which the file has been read;
    ``partial`` holds the bytes after the last newline (a line the writer has
    not finished). ``bytes_read`` counts every byte ever read, so a caller can
    check that a refresh read only what was appended. If the file shrinks
    (replaced or truncated) reading restarts at 0 and ``resets`` is bumped.
    """

    def __init__(self, path: Path, start_near_end: int | None = None):
        self.path = Path(path)
        self.offset = 0
        self.partial = b""
        self.bytes_read = 0
        self.resets = 0
        # For logs only the tail matters: skip to the last N bytes on first read.
        self._start_near_end = start_near_end

    def size(self) -> int | None:
        """Current file size, None while the file does not exist."""
        try:
            return self.path.stat().st_size
        except OSError:
            return None

    def pending(self) -> bool:
        """True when the file holds bytes this tail has not read yet."""
        return (self.size() or 0) > self.offset

    def poll(self, max_bytes: int = 4 << 20) -> list[bytes]:
        """Read at most ``max_bytes`` new bytes; return the lines they complete."""
        size = self.size()
        if size is None:
            return []  # not written yet, or briefly gone: keep what we have
        if size < self.offset:
            self.offset, self.partial = 0, b""
            self.resets += 1
        skip_first = False
        if self.offset == 0 and self._start_near_end and size > self._start_near_end:
            self.offset, skip_first = size - self._start_near_end, True
        self._start_near_end = None
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(min(size - self.offset, max_bytes))
        self.offset += len(data)
        self.bytes_read += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if skip_first and lines:
            lines.pop(0)  # we started mid-line
        return [ln for ln in lines if ln.strip()]


class JsonlTail(LineTail):
    """A ``LineTail`` over JSON Lines: yields dicts, counts lines that are not."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.bad_lines = 0

    def poll_objects(self, max_bytes: int = 4 << 20) -> list[dict]:
        out = []
        for line in self.poll(max_bytes):
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                out.append(obj)
            else:
                self.bad_lines += 1  # e.g. a line torn by a crash, then resumed
        return out


# --------------------------------------------------------------------------- metrics


def _nan_column(n: int) -> array:
    return array("d", [NAN]) * n


class MetricTable:
    """All events of a run as columns: ``steps``, ``times`` and one per key.

    Every column has one entry per row; a key missing from an event is NaN in
    that row. A step not greater than the last one means the run was resumed
    from an earlier checkpoint: rows from that step on are dropped, so the
    table shows the history the resumed run actually continues.
    Non-numeric values (strings, lists) go to ``text`` (latest value only).
    """

    def __init__(self) -> None:
        self.steps = array("q")
        self.times = array("d")
        self.columns: dict[str, array] = {}
        self.text: dict[str, Any] = {}
        self.skipped = 0
        self._stats: dict[str, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, event: dict) -> None:
        try:
            step = int(event["step"])
        except (KeyError, TypeError, ValueError):
            self.skipped += 1
            return
        self._stats.clear()
        if self.steps and step <= self.steps[-1]:
            self._truncate(bisect_left(self.steps, step))
        n = len(self.steps)
        self.steps.append(step)
        t = event.get("time")
        self.times.append(float(t) if isinstance(t, (int, float)) else NAN)
        for key, value in event.items():
            if key in ("step", "time"):
                continue
            if not isinstance(value, (int, float)) or value is None:
                self.text[key] = value
                continue
            col = self.columns.get(key)
            if col is None:
                col = self.columns[key] = _nan_column(n)
            col.append(float(value))
        for col in self.columns.values():
            if len(col) == n:
                col.append(NAN)

    def _truncate(self, i: int) -> None:
        del self.steps[i:]
        del self.times[i:]
        for col in self.columns.values():
            del col[i:]

    def column(self, key: str) -> array | None:
        return self.columns.get(key)

    def value(self, key: str, row: int) -> float:
        col = self.columns.get(key)
        if col is None or not 0 <= row < len(col):
            return NAN
        return col[row]

    def stats(self, key: str) -> tuple[float, float]:
        """(mean, max) of a column ignoring NaN; cached until the next ``add``,
        so scrubbing a 100,000-step run does not rescan columns per keypress."""
        if key not in self._stats:
            col = np.array(self.columns.get(key, ()), dtype=np.float64)
            col = col[np.isfinite(col)]
            self._stats[key] = (float(col.mean()), float(col.max())) if col.size else (NAN, NAN)
        return self._stats[key]

    def row(self, i: int) -> dict[str, float]:
        """The event at row ``i`` as a dict of the keys it had."""
        return {k: c[i] for k, c in self.columns.items() if not math.isnan(c[i])}

    def keys(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, in the order they first appeared."""
        return [k for k in self.columns if k.startswith(prefix)]

    def row_of_step(self, step: int) -> int:
        """Row holding ``step``, or the last row before it."""
        i = bisect_left(self.steps, step)
        if i < len(self.steps) and self.steps[i] == step:
            return i
        return max(i - 1, 0)


# --------------------------------------------------------------------------- small files


@dataclass
class RunStatus:
    """``status.json``, with ``status`` already corrected for crashed runs."""

    name: str
    algorithm: str = "?"
    model: str = "?"
    status: str = "unknown"
    step: int = 0
    total_steps: int = 0
    started: float | None = None
    updated: float | None = None
    pid: int | None = None
    hostname: str | None = None
    error: str | None = None
    crashed: bool = False


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 probe)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except (OverflowError, ValueError, OSError):
        return False
    return True


def read_json(path: Path) -> Any:
    """Parsed JSON, or None when the file is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_recipe(run_dir: Path) -> dict:
    """The resolved recipe as a dict ({} when missing or not YAML)."""
    try:
        data = yaml.safe_load((Path(run_dir) / RECIPE).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def _number(value: Any, kind: type) -> Any:
    """``kind(value)`` for a JSON number, else None: a hand-edited or foreign file must not crash a view."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return kind(value)


def read_status(run_dir: Path, recipe: dict | None = None) -> RunStatus:
    """Status of a run; fields missing from status.json come from recipe.yaml.

    A ``running`` run whose pid is gone is reported ``failed`` (crashed) — but
    only if it ran on this host: a pid from another machine says nothing here.
    """
    run_dir = Path(run_dir)
    raw = read_json(run_dir / STATUS)
    raw = raw if isinstance(raw, dict) else {}
    recipe = read_recipe(run_dir) if recipe is None else recipe
    st = RunStatus(
        name=str(raw.get("name") or recipe.get("name") or run_dir.name),
        algorithm=str(raw.get("algorithm") or recipe.get("algorithm") or "?"),
        model=str(raw.get("model") or _get(recipe, "model.path") or "?"),
        status=str(raw.get("status") or "unknown"),
        step=_number(raw.get("step"), int) or 0,
        total_steps=_number(raw.get("total_steps"), int) or _number(_get(recipe, "trainer.total_steps"), int) or 0,
        started=_number(raw.get("started"), float),
        updated=_number(raw.get("updated"), float),
        pid=_number(raw.get("pid"), int),
        hostname=raw.get("hostname"),
        error=None if raw.get("error") is None else str(raw["error"]),
    )
    if (
        st.status == "running"
        and st.pid is not None
        and st.hostname == socket.gethostname()
        and not pid_alive(st.pid)
    ):
        st.status, st.crashed = "failed", True
        st.error = st.error or f"process {st.pid} is gone (crashed or killed)"
    return st


@dataclass
class Pool:
    name: str
    devices: list[str]
    roles: list[str]


@dataclass
class Plan:
    """``plan.json``: where every role runs."""

    backend: str
    pools: list[Pool]
    roles: dict[str, dict] = field(default_factory=dict)  # role -> {"pool", "ranks"}

    def device(self, role: str, rank: int) -> str | None:
        """Device of ``rank`` of ``role``: its pool's devices indexed by rank."""
        pool_name = self.roles.get(role, {}).get("pool")
        for pool in self.pools:
            if pool.name == pool_name and 0 <= rank < len(pool.devices):
                return pool.devices[rank]
        return None


def read_plan(run_dir: Path) -> Plan | None:
    raw = read_json(Path(run_dir) / PLAN)
    if not isinstance(raw, dict):
        return None
    pools = [
        Pool(str(p.get("name", "?")), [str(d) for d in p.get("devices", [])], [str(r) for r in p.get("roles", [])])
        for p in raw.get("pools", [])
        if isinstance(p, dict)
    ]
    roles = {str(k): v for k, v in (raw.get("roles") or {}).items() if isinstance(v, dict)}
    return Plan(str(raw.get("backend", "?")), pools, roles)


def read_last_event(run_dir: Path, window: int = 1 << 16) -> dict | None:
    """The last complete event of ``events.jsonl``, reading only its end."""
    path = Path(run_dir) / EVENTS
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - window, 0))
            data = f.read()
    except OSError:
        return None
    for line in reversed(data.split(b"\n")):
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # the torn last line, or the cut first one
        if isinstance(obj, dict):
            return obj
    return None


# --------------------------------------------------------------------------- finding runs


def is_run_dir(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and any((path / f).is_file() for f in RUN_FILES)


def start_time(run_dir: Path, status: RunStatus | None = None) -> float:
    """When a run started: status.json's ``started``, else the directory's mtime."""
    status = status or read_status(run_dir)
    if isinstance(status.started, (int, float)):
        return float(status.started)
    return Path(run_dir).stat().st_mtime


def find_runs(root: Path) -> list[Path]:
    """Run directories directly under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        raise RunDirError(f"{root}: no such directory (expected a folder of runs written by `hflow train`)")
    runs = [p for p in root.iterdir() if is_run_dir(p)]
    return sorted(runs, key=lambda p: (start_time(p), p.name))


def newest_run(root: Path) -> Path:
    runs = find_runs(root)
    if not runs:
        raise RunDirError(f"{root}: no runs found (expected run directories written by `hflow train`)")
    return runs[-1]


def check_run_dir(path: Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise RunDirError(f"{path}: no such directory (expected a run directory written by `hflow train`)")
    if not is_run_dir(path):
        raise RunDirError(
            f"{path}: not a run directory (expected one of {', '.join(RUN_FILES)} written by `hflow train`)"
        )
    return path


# --------------------------------------------------------------------------- live view


class RunWatcher:
    """Everything the monitor shows, kept current by ``refresh()``.

    Each refresh reads only appended bytes of the JSONL files and the log,
    and re-reads the small JSON files only when their mtime changed.
    """

    def __init__(self, run_dir: Path, chunk_bytes: int = 4 << 20, keep_samples: int = 1000, keep_log: int = 500):
        self.run_dir = Path(run_dir)
        self.chunk_bytes = chunk_bytes
        self.events = JsonlTail(self.run_dir / EVENTS)
        self.samples_tail = JsonlTail(self.run_dir / SAMPLES)
        self.log_tail = LineTail(self.run_dir / LOG, start_near_end=64 << 10)
        self.table = MetricTable()
        self.samples: deque[dict] = deque(maxlen=keep_samples)
        self.log_lines: deque[str] = deque(maxlen=keep_log)
        self.log_count = 0  # lines of train.log read so far, so a view can append only new ones
        self.recipe = read_recipe(self.run_dir)
        self.status = read_status(self.run_dir, self.recipe)
        self.plan = read_plan(self.run_dir)
        self._mtimes: dict[str, float] = {}

    def _changed(self, name: str) -> bool:
        try:
            m = (self.run_dir / name).stat().st_mtime_ns
        except OSError:
            m = -1
        changed = self._mtimes.get(name) != m
        self._mtimes[name] = m
        return changed

    def refresh(self) -> bool:
        """Read what is new; True when anything the monitor shows changed."""
        changed = False
        resets = self.events.resets
        events = self.events.poll_objects(self.chunk_bytes)
        if self.events.resets != resets:
            self.table = MetricTable()  # file was rewritten: start over
        for ev in events:
            self.table.add(ev)
        changed |= bool(events)
        new_samples = self.samples_tail.poll_objects(self.chunk_bytes)
        self.samples.extend(new_samples)
        new_log = self.log_tail.poll(self.chunk_bytes)
        self.log_lines.extend(ln.decode("utf-8", "replace").rstrip("\r") for ln in new_log)
        self.log_count += len(new_log)
        changed |= bool(new_samples or new_log)
        if self._changed(RECIPE):
            self.recipe = read_recipe(self.run_dir)
        # status.json must be re-read even if unchanged: a dead pid flips it to failed.
        status = read_status(self.run_dir, self.recipe)
        changed |= status != self.status
        self.status = status
        if self._changed(PLAN):
            self.plan = read_plan(self.run_dir)
            changed = True
        return changed

    def pending(self) -> bool:
        """More event bytes are waiting than one refresh reads (initial load)."""
        return self.events.pending()

    def samples_at(self, step: int) -> list[dict]:
        """Samples of ``step``, or of the latest step before it that has some."""
        best: list[dict] = []
        best_step = None
        for s in reversed(self.samples):
            st = s.get("step")
            if not isinstance(st, int) or st > step:
                continue
            if best_step is None:
                best_step = st
            if st != best_step:
                break
            best.append(s)
        return best[::-1]


def iter_memory_keys(keys: list[str]) -> Iterator[tuple[str, int, str]]:
    """(role, rank, key) for every ``memory/<role>/rank<k>/peak_bytes`` key."""
    for key in keys:
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "memory" and parts[3] == "peak_bytes" and parts[2].startswith("rank"):
            try:
                yield parts[1], int(parts[2][4:]), key
            except ValueError:
                continue
