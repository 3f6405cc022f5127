"""Writing the run directory (its layout: `layout.py`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from hflow.errors import UserError
from hflow.trainer.config.load import dump_recipe
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.layout import (
    CHECKPOINTS,
    COMPLETE,
    EVENTS,
    LOG,
    PLAN,
    RECIPE,
    SAMPLES,
    STATUS,
    TRAINER_STATE,
    checkpoint_name,
)


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
        (path / RECIPE).write_text(dump_recipe(recipe))
        run = cls(path, recipe)
        run._attach_log()
        return run

    @classmethod
    def reopen(cls, path: Path, recipe: Recipe) -> "RunDir":
        run = cls(path, recipe)
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

    def close(self) -> None:
        logging.getLogger("hflow").removeHandler(self._handler)
        self._handler.close()

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
        atomic_write(self.path / STATUS, json.dumps(record))

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
        path = self.path / EVENTS
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def truncate_events(self, last_step: int) -> None:
        """Drop events after `last_step` (logged after the checkpoint a resume starts from)."""
        kept = [e for e in self.events() if e["step"] <= last_step]
        atomic_write(self.path / EVENTS, "".join(json.dumps(e) + "\n" for e in kept))
        samples = self.path / SAMPLES
        if samples.exists():
            rows = [json.loads(x) for x in samples.read_text().splitlines() if x.strip()]
            atomic_write(samples, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= last_step))

    # --- checkpoints ---------------------------------------------------------------

    def staging_checkpoint(self, step: int) -> Path:
        """A fresh directory to write step `step`'s checkpoint into before committing it."""
        tmp = self.checkpoints / f".{checkpoint_name(step)}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, tmp: Path, step: int, state: dict[str, Any]) -> Path:
        """Mark complete, then rename into place: a crash leaves no checkpoint that looks whole."""
        (tmp / TRAINER_STATE).write_text(json.dumps(state))
        (tmp / COMPLETE).write_text(str(step))
        final = self.checkpoints / checkpoint_name(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in self.complete_checkpoints()[:-self.recipe.trainer.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def complete_checkpoints(self) -> list[Path]:
        found = [p for p in self.checkpoints.glob("step_*") if (p / COMPLETE).exists()]
        return sorted(found, key=lambda p: int(p.name.split("_")[1]))

    def latest_checkpoint(self) -> Path | None:
        found = self.complete_checkpoints()
        return found[-1] if found else None
