"""Writing the run directory (its layout: `layout.py`), every file through `files.py`.

A write that fails (a full disk, the run directory moved or deleted during the run) ends the run
in one line: a MachineError naming the file, the run and its last complete checkpoint. A failed
run's status.json is still written when the disk has no room for a new file (`files.overwrite`),
and train.log drops a line it cannot write rather than print a traceback for it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from hflow.engine.groups.worker import WorkerError
from hflow.errors import MachineError, UserError
from hflow.trainer.config.load import read_yaml
from hflow.trainer.config.recipe import Recipe, run_name_problem
from hflow.trainer.rundir import files
from hflow.trainer.rundir.checkpoints import manifest, newest_whole, verify
from hflow.trainer.rundir.layout import (
    CHECKPOINTS,
    COMPLETE,
    DAMAGED,
    EVENTS,
    FINAL,
    FINAL_REPLACED,
    FINAL_STAGING,
    LOCK,
    LOG,
    PLAN,
    RECIPE,
    SAMPLES,
    STATUS,
    TRAINER_STATE,
    checkpoint_name,
)
from hflow.trainer.rundir.read import read_json
from hflow.trainer.rundir.recipe_file import HASH_KEY, check_unedited, write_recipe

log = logging.getLogger("hflow.rundir")


class RunDir:
    def __init__(self, path: Path, recipe: Recipe):
        self.path = path
        self.recipe = recipe
        self.checkpoints = path / CHECKPOINTS
        self.started = time.time()
        self.ray_address: str | None = None  # an existing Ray cluster to run the workers on
        self.recipe_digest: str | None = None  # recipe.yaml's hash, kept in every checkpoint
        self._lock_fd: int | None = None
        self._handler: files.LogFile | None = None

    # --- creating and reopening ---------------------------------------------------

    @classmethod
    def create(cls, recipe: Recipe, output_dir: str | None = None) -> "RunDir":
        root = Path(output_dir or recipe.trainer.output_dir)
        name = recipe.name or "run"
        problem = run_name_problem(name)  # the schema checks it too: `name` stays inside `root`
        if problem:
            raise UserError(f"recipe name {name!r}: {problem}")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = root / f"{name}-{stamp}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = root / f"{name}-{stamp}-{suffix}"
        try:
            (path / CHECKPOINTS).mkdir(parents=True)
        except OSError as err:
            raise UserError(f"--output-dir {root}: cannot create the run directory ({err.strerror})") from None
        run = cls(path, recipe)
        run._lock()
        with run._writing(RECIPE):
            run.recipe_digest = write_recipe(path, recipe)
        run._attach_log()
        return run

    @classmethod
    def reopen(cls, path: Path, recipe: Recipe) -> "RunDir":
        """The run at `path`, to continue it: no file of it a link (`files.refuse_links`), its
        recipe.yaml as the run wrote it (`recipe_file.check_unedited`), locked before anything in
        it is written."""
        run = cls(path, recipe)
        files.refuse_links(path)
        run.recipe_digest = check_unedited(path, read_yaml(path / RECIPE))
        run._lock()
        status = run.read_status()
        if status.get("started"):
            run.started = status["started"]
        run._attach_log()
        return run

    def _attach_log(self) -> None:
        handler = files.LogFile(self.path / LOG)
        with self._writing(LOG):
            files.append(handler.path, "")  # there from the start, even before a line is logged
        root = logging.getLogger("hflow")
        root.setLevel(logging.INFO)
        root.addHandler(handler)
        self._handler = handler

    def _lock(self) -> None:
        """Hold `run.lock` (flock) until `close`, or until this process ends however it ends: the
        kernel drops the lock then, so a crash leaves no stale lock. A second process that wants
        to write the run stops here with a UserError naming the holder."""
        lock = self.path / LOCK
        try:
            fd = files.open_file(lock, os.O_RDWR | os.O_CREAT)  # not inherited by children
        except IsADirectoryError:
            raise UserError(f"{lock} is a folder, not the run's lock file; remove it (hflow holds a lock on "
                            "that file while a process writes the run)") from None
        except OSError as err:
            raise UserError(f"{lock}: cannot open the run's lock file ({err.strerror}); hflow needs to write "
                            f"in {self.path}") from None
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
        self._lock_fd = fd
        with contextlib.suppress(OSError):  # who holds it is a courtesy to the next process (`_holder`)
            os.ftruncate(fd, 0)
            files.write_all(fd, json.dumps({"pid": os.getpid(), "hostname": socket.gethostname()}).encode())

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
        """Detach train.log and release the lock; it raises nothing, so that it never hides the
        error that ended the run."""
        if self._handler is not None:
            logging.getLogger("hflow").removeHandler(self._handler)
            self._handler = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
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
        text = json.dumps(record)
        if status != "failed":
            with self._writing(STATUS):
                files.atomic_write(self.path / STATUS, text)
            return
        # The last word: a run that failed, for a full disk too, ends marked failed with its reason
        # when at all possible, and with its own one-line error whatever happens here.
        for write in (files.atomic_write, files.overwrite):
            try:
                write(self.path / STATUS, text)
                return
            except (OSError, UserError) as err:
                problem = getattr(err, "strerror", None) or str(err)
        log.error("cannot write %s (%s); the run failed: %s", STATUS, problem, error)

    def append_event(self, event: dict[str, Any]) -> None:
        with self._writing(EVENTS):
            files.append(self.path / EVENTS, json.dumps(event) + "\n")

    def append_samples(self, samples: list[dict[str, Any]]) -> None:
        if samples:
            with self._writing(SAMPLES):
                files.append(self.path / SAMPLES, "".join(json.dumps(s) + "\n" for s in samples))

    def read_plan(self) -> dict[str, Any]:
        """plan.json as the run last wrote it; {} when there is none or it is not a JSON object."""
        plan = read_json(self.path / PLAN)
        return plan if isinstance(plan, dict) else {}

    def write_plan(self, plan: dict[str, Any]) -> None:
        with self._writing(PLAN):
            files.atomic_write(self.path / PLAN, json.dumps(plan, indent=2))

    @contextlib.contextmanager
    def _writing(self, name: str) -> Iterator[None]:
        """An OSError while writing `name` becomes one line (`_write_failed`)."""
        try:
            yield
        except OSError as err:
            raise self._write_failed(name, err) from None

    def _write_failed(self, what: str, err: BaseException) -> MachineError:
        """The one line for a write of `what` that failed: why, and the last complete checkpoint;
        a run directory that is gone is said so (nothing in it is re-created)."""
        if not self.path.is_dir():
            message = f"cannot write {what}: the run directory {self.path} is gone (moved or deleted during the run)"
        else:
            why = (err.strerror or str(err)) if isinstance(err, OSError) else str(err)
            try:
                last = self.complete_checkpoints()
            except OSError:
                last = []
            kept = f"the last complete checkpoint is {last[-1].name}" if last else "no checkpoint was written yet"
            message = f"cannot write {what} in {self.path}: {why}; {kept}"
        log.error("%s", message)
        return MachineError(message)

    def events(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / EVENTS)

    def truncate_events(self, last_step: int) -> None:
        """Drop events after `last_step` (logged after the checkpoint a resume starts from), and a
        line torn by a crash."""
        kept = [e for e in self.events() if e["step"] <= last_step]
        with self._writing(EVENTS):
            files.atomic_write(self.path / EVENTS, "".join(json.dumps(e) + "\n" for e in kept))
        samples = self.path / SAMPLES
        if samples.exists():
            rows = read_jsonl(samples)
            with self._writing(SAMPLES):
                files.atomic_write(samples, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= last_step))

    # --- checkpoints ---------------------------------------------------------------

    def staging_checkpoint(self, step: int) -> Path:
        """A fresh directory to write step `step`'s checkpoint into before committing it."""
        tmp = self._staging(step)
        shutil.rmtree(tmp, ignore_errors=True)
        self.checkpoints.mkdir(exist_ok=True)  # not parents: a run directory deleted mid-run stays deleted
        tmp.mkdir()
        return tmp

    def _staging(self, step: int) -> Path:
        return self.checkpoints / f".{checkpoint_name(step)}.tmp"

    def commit_checkpoint(self, tmp: Path, step: int, state: dict[str, Any]) -> Path:
        """Mark complete, then rename into place: a crash leaves no checkpoint that looks whole.
        COMPLETE lists every file's size, so that a file cut later is found on resume; the
        controller's state carries recipe.yaml's hash (`recipe_file.py`). Then the newest
        `trainer.keep_checkpoints` that verify are kept (`_prune`)."""
        if self.recipe_digest:
            state = {**state, HASH_KEY: self.recipe_digest}
        files.write(tmp / TRAINER_STATE, json.dumps(state))
        files.write(tmp / COMPLETE, json.dumps({"step": step, "files": manifest(tmp)}))
        final = self.checkpoints / checkpoint_name(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._prune()
        return final

    def _prune(self) -> None:
        """Delete all but the newest `trainer.keep_checkpoints` checkpoints that verify. One that
        does not verify is never counted among them (a damaged newest one would otherwise outlive
        every good one written after it): it is moved aside, in one line, and kept."""
        verified = []
        for checkpoint in self.complete_checkpoints():
            problem = verify(checkpoint)
            if problem is None:
                verified.append(checkpoint)
                continue
            moved = self._set_aside(checkpoint)
            where = f"moved to {moved} for inspection" if moved else "left in place"
            line = (f"checkpoint {checkpoint.name} does not verify: {problem}; {where}, not counted among the "
                    f"trainer.keep_checkpoints={self.recipe.trainer.keep_checkpoints} kept")
            log.warning("%s", line)
            print(line, file=sys.stderr, flush=True)
        for old in verified[:-self.recipe.trainer.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def _set_aside(self, checkpoint: Path) -> str | None:
        """Move a checkpoint that does not verify into checkpoints/damaged/ (a name taken there gets
        -2, -3, ...); its new place relative to the run directory, or None when it cannot move."""
        damaged = self.checkpoints / DAMAGED
        try:
            damaged.mkdir(exist_ok=True)
            target, n = damaged / checkpoint.name, 1
            while target.exists():
                n += 1
                target = damaged / f"{checkpoint.name}-{n}"
            os.rename(checkpoint, target)
        except OSError as err:
            log.warning("cannot move %s into %s: %s", checkpoint, damaged, err.strerror or err)
            return None
        return target.relative_to(self.path).as_posix()

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
            raise self._write_failed(f"checkpoint {checkpoint_name(step)}", err) from None

    @contextlib.contextmanager
    def writing_final(self) -> Iterator[Path]:
        """A fresh folder to export the trained model into; renamed to final/ once whole (a final/
        from before is replaced only then), so that a final/ is never half written. An OSError
        becomes one line, as a checkpoint's does."""
        staging, final, replaced = self.path / FINAL_STAGING, self.path / FINAL, self.path / FINAL_REPLACED
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            yield staging
            if final.exists():
                shutil.rmtree(replaced, ignore_errors=True)
                os.rename(final, replaced)
            os.rename(staging, final)
            shutil.rmtree(replaced, ignore_errors=True)
        except (OSError, WorkerError) as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise self._write_failed(FINAL, err) from None

    def complete_checkpoints(self) -> list[Path]:
        found = [p for p in self.checkpoints.glob("step_*") if (p / COMPLETE).exists()]
        return sorted(found, key=lambda p: int(p.name.split("_")[1]))

    def resume_checkpoint(self) -> tuple[Path | None, list[str]]:
        """The newest complete checkpoint whose files verify (`checkpoints.verify`), or None; and
        one line for each newer one skipped, saying why: each is moved into checkpoints/damaged/."""
        return newest_whole(self.complete_checkpoints(), self._set_aside)


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
