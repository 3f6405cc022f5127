"""What `--checkpoint DIR` (`hflow eval`, `hflow.evaluate`) names: a run's checkpoint, verified as a
resume verifies it, a model directory, or a run folder (its final model, else its newest whole
checkpoint)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.checkpoints import newest_whole, verify
from hflow.trainer.rundir.layout import CHECKPOINTS, COMPLETE, FINAL, TRAINER_STATE
from hflow.trainer.rundir.read import is_run_dir


def checkpoint_source(directory: Path, recipe: Recipe) -> tuple[str | None, int]:
    """(checkpoint for the actor or None, step) of DIR; a model directory becomes `model.path`."""
    directory = _in_run(Path(directory))
    if any((directory / name).exists() for name in (TRAINER_STATE, COMPLETE, "actor")):
        _check_checkpoint(directory)
        return str(directory), int(json.loads((directory / TRAINER_STATE).read_text())["step"])
    if (directory / "config.json").is_file():
        recipe.model.path = str(directory)
        recipe.model.init = None
        return None, recipe.trainer.total_steps
    raise UserError(f"--checkpoint {directory}: not a checkpoint (RUN/checkpoints/step_N with trainer_state.json "
                    "and actor/), a model directory (with config.json) nor a run folder")


def _in_run(directory: Path) -> Path:
    """What to evaluate of DIR when it is a run folder (else DIR itself), said on stderr."""
    if not is_run_dir(directory):
        return directory
    if (directory / FINAL / "config.json").is_file():
        chosen = directory / FINAL
    else:
        chosen, _ = newest_whole(sorted((directory / CHECKPOINTS).glob("step_*")))
        if chosen is None:
            raise UserError(f"--checkpoint {directory}: the run has no {FINAL}/ model and no whole checkpoint "
                            f"under {CHECKPOINTS}/ to evaluate")
    print(f"evaluating {chosen}", file=sys.stderr)
    return chosen


def _check_checkpoint(directory: Path) -> None:
    earlier = "evaluate an earlier checkpoint, or the run's final/"
    if not (directory / COMPLETE).is_file():
        raise UserError(f"--checkpoint {directory}: no {COMPLETE} marker, so the checkpoint was never finished "
                        f"(a crash or a full disk while it was written); {earlier}")
    problem = verify(directory)
    if problem:
        raise UserError(f"--checkpoint {directory}: the checkpoint is damaged: {problem}; {earlier}")
    if not (directory / "actor").is_dir():
        raise UserError(f"--checkpoint {directory}: the checkpoint has no actor/ folder; {earlier}")
