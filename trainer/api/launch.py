"""The steps between a checked recipe and a finished run, shared by `hflow train` and `hflow.train`:
the inputs checked and the tiny model built before a run directory exists, then the algorithm run
to its end, the run marked however it ends."""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from typing import Callable

from hflow.errors import UserError
from hflow.trainer.config.load import absolute_paths
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.writer import RunDir
from hflow.trainer.stop import is_stop


def prepare(recipe: Recipe, output_dir: Path | None, resume: bool = False,
            checked: bool = False) -> tuple[Callable, Recipe]:
    """The algorithm's program and the recipe to run (`check_runtime` passed already): the tiny
    model built when `model.init` asks, every input checked (`control/inputs.py`; `checked`: the
    caller checked them, as `hflow train` does before torch loads, and they are checked again only
    when the tiny model was built now), the device checked, and, for a new run, every local path
    made absolute (a resume from anywhere reads the same files) and `output_dir` recorded."""
    from hflow.engine.models.loading import build_tiny_model
    from hflow.trainer.algorithms.registry import trainer_for
    from hflow.trainer.control.inputs import check_inputs

    algorithm = trainer_for(recipe.algorithm)
    built = bool(recipe.model.init) and not Path(recipe.model.path).exists()
    if built:
        build_tiny_model(recipe.model.path, recipe.model.init, recipe.seed)
    if built or not checked:
        check_inputs(recipe)  # before a run directory is made for them
    _check_device(recipe)
    _note_slow_bf16(recipe)
    if not resume:
        if output_dir is not None:
            recipe = recipe.model_copy(deep=True)
            recipe.trainer.output_dir = str(output_dir)  # the run directory records where it went
        recipe = absolute_paths(recipe)
    return algorithm, recipe


def run_to_end(algorithm: Callable, recipe: Recipe, run: RunDir) -> None:
    """Run the algorithm; however it ends, the run is marked and its directory closed (unlocked)."""
    from hflow.trainer.control.session import failure_message

    try:
        algorithm(recipe, run)
    except BaseException as err:
        # The session has marked the run failed already when it was running; this covers the
        # start-up before it (the same line either way).
        run.write_status("failed", run.read_status().get("step", 0), failure_message(err))
        if is_stop(err):
            logging.getLogger("hflow").warning("run stopped: %s\n%s", failure_message(err), traceback.format_exc())
        elif not isinstance(err, UserError) or err.__cause__ is not None:
            # A bug's traceback, or the user's reward function's (a UserError's cause), for train.log.
            logging.getLogger("hflow").error("run failed:\n%s", traceback.format_exc())
        raise
    finally:
        run.close()


def _check_device(recipe: Recipe) -> None:
    """A GPU that CUDA cannot use, or model.dtype bfloat16 on a GPU without it, stops the run in
    one line before a run directory is made (each worker checks its own GPU again)."""
    from hflow.engine.groups.dist import pick_device
    from hflow.engine.models.loading import resolve_dtype

    device = pick_device(recipe.trainer.device)
    if device.type == "cuda":
        resolve_dtype(recipe.model.dtype, device)


def _note_slow_bf16(recipe: Recipe) -> None:
    """One line when bf16 was asked for on a CPU that can only emulate it (the run is slower)."""
    import torch

    from hflow.engine.models.loading import cpu_has_native_bf16

    if recipe.model.dtype == "bfloat16" and not torch.cuda.is_available() and cpu_has_native_bf16() is False:
        print("note: model.dtype bfloat16 on a CPU without AVX512-BF16 or AMX: torch emulates bf16 matrix "
              "products here, many times slower than float32 (model.dtype: float32 or auto)", file=sys.stderr)
