"""Read a run directory written by `hflow train`, while it is being written: its small files
and where runs are.

`hflow monitor`, `hflow runs` and any later analysis read the same files (DESIGN.md,
"Runs"; the names: `layout.py`). The views stay thin; the file handling lives here and
beside it, once: `tail.py` follows the growing files, `metrics.py` holds the events as
columns, `watcher.py` keeps the monitor's view current. ``read_status`` applies the
crashed-process rule: ``running`` with a pid that is gone on this host is shown as
``failed``.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hflow.trainer.rundir.layout import EVENTS, PLAN, RECIPE, RUN_FILES, STATUS


class RunDirError(Exception):
    """A user-facing problem with a run directory: the message names the path."""


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
