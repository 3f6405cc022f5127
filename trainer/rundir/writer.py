"""Writing the run directory (its layout: `layout.py`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from hflow.engine.groups.worker import WorkerError
from hflow.errors import MachineError, UserError
from hflow.trainer.config.load import dump_recipe
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.checkpoints import manifest, newest_whole
from hflow.trainer.rundir.layout import (
    CHECKPOINTS,
    COMPLETE,
    EVENTS,
    LOCK,
    LOG,
    PLAN,
    RECIPE,
    SAMPLES,
    STATUS,
    TRAINER_STATE,
    checkpoint_name,
)

log = logging.getLogger("hflow.rundir")


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: Path, recipe: Recipe):
        self.path = path
        self.recipe = recipe
        self.checkpoints = path / CHECKPOINTS
        self.started = time.time()
        self.ray_address: str | None = None  # an existing Ray cluster to run the workers on
        self._lock_fd: int | None = None

    # --- creating and reopening ---------------------------------------------------

    @classmethod
    def create(cls, recipe: Recipe, output_dir: str | None = None) -> "RunDir":
        root = Path(output_dir or recipe.trainer.output_dir)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = root / f"{recipe.name}-{stamp}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = root / f"{recipe.name}-{stamp}-{suffix}"
        try:
            (path / CHECKPOINTS).mkdir(parents=True)
        except OSError as err:
            raise UserError(f"--output-dir {root}: cannot create the run directory ({err.strerror})") from None
        run = cls(path, recipe)
        run._lock()
        (path / RECIPE).write_text(dump_recipe(recipe))
        run._attach_log()
        return run

    @classmethod
    def reopen(cls, path: Path, recipe: Recipe) -> "RunDir":
        """The run at `path`, to continue it: locked before anything in it is written."""
        run = cls(path, recipe)
        run._lock()
        status = run.read_status()
        if status.get("started"):
            run.started = status["started"]
        run._attach_log()
        return run

    def _attach_log(self) -> None:
        handler = logging.FileHandler(self.path / LOG)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger("hflow")
        root.setLevel(logging.INFO)
        root.addHandler(handler)
        self._handler = handler

    def _lock(self) -> None:
        """Hold `run.lock` (flock) until `close`, or until this process ends however it ends: the
        kernel drops the lock then, so a crash leaves no stale lock. A second process that wants
        to write the run stops here with a UserError naming the holder."""
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"--resume {self.path}: the run is still running ({self._holder()} holds its "
                            f"{LOCK}); wait for it to end, or stop it with kill -TERM (it keeps its last "
                            "checkpoint) and resume then") from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            os.close(fd)
            logging.getLogger("hflow").warning("%s: no file locks on this filesystem (%s); nothing stops a "
                                               "second process writing this run", self.path, err.strerror)
            return
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "hostname": socket.gethostname()}).encode())
        self._lock_fd = fd

    def _holder(self) -> str:
        """`pid N on HOST` of the process holding the lock: from the lock file, else status.json."""
        try:
            holder = json.loads((self.path / LOCK).read_text())
        except (OSError, json.JSONDecodeError):
            holder = {}
        holder = holder if isinstance(holder, dict) and holder.get("pid") else self.read_status()
        if not holder.get("pid"):
            return "another process"
        return f"pid {holder['pid']} on {holder.get('hostname') or 'an unknown host'}"

    def close(self) -> None:
        logging.getLogger("hflow").removeHandler(self._handler)
        self._handler.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None

    # --- status and events --------------------------------------------------------

    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / STATUS).read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def write_status(self, status: str, step: int, error: str | None = None) -> None:
        record = {
            "name": self.path.name,
            "algorithm": self.recipe.algorithm,
            "model": self.recipe.model.path,
            "status": status,
            "step": step,
            "total_steps": self.recipe.trainer.total_steps,
            "started": self.started,
            "updated": time.time(),
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "error": error,
        }
        try:
            atomic_write(self.path / STATUS, json.dumps(record))
        except OSError as err:
            if status != "failed":
                raise
            # A run that failed because the disk is full still ends with its own one-line error.
            log.error("cannot write %s (%s); the run failed: %s", STATUS, err.strerror or err, error)

    def append_event(self, event: dict[str, Any]) -> None:
        with open(self.path / EVENTS, "a") as f:
            f.write(json.dumps(event) + "\n")

    def append_samples(self, samples: list[dict[str, Any]]) -> None:
        if samples:
            with open(self.path / SAMPLES, "a") as f:
                f.writelines(json.dumps(s) + "\n" for s in samples)

    def write_plan(self, plan: dict[str, Any]) -> None:
        atomic_write(self.path / PLAN, json.dumps(plan, indent=2))

    def events(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / EVENTS)

    def truncate_events(self, last_step: int) -> None:
        """Drop events after `last_step` (logged after the checkpoint a resume starts from), and a
        line torn by a crash."""
        kept = [e for e in self.events() if e["step"] <= last_step]
        atomic_write(self.path / EVENTS, "".join(json.dumps(e) + "\n" for e in kept))
        samples = self.path / SAMPLES
        if samples.exists():
            rows = read_jsonl(samples)
            atomic_write(samples, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= last_step))

    # --- checkpoints ---------------------------------------------------------------

    def staging_checkpoint(self, step: int) -> Path:
        """A fresh directory to write step `step`'s checkpoint into before committing it."""
        tmp = self._staging(step)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def _staging(self, step: int) -> Path:
        return self.checkpoints / f".{checkpoint_name(step)}.tmp"

    def commit_checkpoint(self, tmp: Path, step: int, state: dict[str, Any]) -> Path:
        """Mark complete, then rename into place: a crash leaves no checkpoint that looks whole.
        COMPLETE lists every file's size, so that a file cut later is found on resume."""
        (tmp / TRAINER_STATE).write_text(json.dumps(state))
        (tmp / COMPLETE).write_text(json.dumps({"step": step, "files": manifest(tmp)}))
        final = self.checkpoints / checkpoint_name(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in self.complete_checkpoints()[:-self.recipe.trainer.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    @contextlib.contextmanager
    def writing_checkpoint(self, step: int) -> Iterator[None]:
        """Around staging, writing and committing step `step`'s checkpoint: an OSError (a full
        disk, a folder that cannot be written), here or in a worker, becomes a one-line
        MachineError naming the run and the step; the staging folder is removed and the
        earlier checkpoints stay as they were."""
        try:
            yield
        except (OSError, WorkerError) as err:
            shutil.rmtree(self._staging(step), ignore_errors=True)
            last = self.complete_checkpoints()
            why = (err.strerror or str(err)) if isinstance(err, OSError) else str(err)
            kept = f"the last complete checkpoint is {last[-1].name}" if last else "no checkpoint was written yet"
            message = f"cannot write checkpoint {checkpoint_name(step)} in {self.path}: {why}; {kept}"
            log.error("%s", message)
            raise MachineError(message) from None

    def complete_checkpoints(self) -> list[Path]:
        found = [p for p in self.checkpoints.glob("step_*") if (p / COMPLETE).exists()]
        return sorted(found, key=lambda p: int(p.name.split("_")[1]))

    def resume_checkpoint(self) -> tuple[Path | None, list[str]]:
        """The newest complete checkpoint whose files verify (`checkpoints.verify`), or None; and
        one line for each newer one skipped, saying why."""
        return newest_whole(self.complete_checkpoints())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON Lines file written by this module, without a line a crash cut short
    (unterminated and unparsable: dropped, as the readers in read.py and tail.py do)."""
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            log.warning("%s line %d is not JSON (cut short by a crash?); dropped", path.name, number)
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
