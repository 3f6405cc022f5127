"""`hflow train RECIPE`: run a recipe; the run directory is printed as the last line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.errors import RunFailed, UserError
from hflow.trainer.api.resume import finished, resume_recipe, settable
from hflow.trainer.config.load import load_recipe
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.preflight import check_runtime
from hflow.trainer.rundir.layout import RECIPE
from hflow.trainer.stop import is_stop, stop_exit_code, stop_message, stop_signals

if TYPE_CHECKING:
    from hflow.trainer.rundir.writer import RunDir


def train(
    recipe: Annotated[Optional[str], typer.Argument(
        help="Recipe file, or a shipped recipe name like grpo/quickstart (optional with --resume).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a key: --set trainer.total_steps=20.")] = [],
    output_dir: Annotated[Optional[Path], typer.Option(
        help="Folder for the run directory (default: the recipe's trainer.output_dir).")] = None,
    resume: Annotated[Optional[Path], typer.Option(
        help="Continue the run in this run directory from its last checkpoint.")] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        envvar="RAY_ADDRESS", show_envvar=True,
        help="Run the workers on an existing Ray cluster: 'auto' or HOST:PORT (`ray job submit` sets "
        "RAY_ADDRESS). Without it, the recipe's placement.ray_address; without that, a local Ray "
        "instance is started when the placement needs the ray backend.")] = None,
) -> None:
    """Train with RECIPE. Writes a run directory (recipe, events.jsonl, checkpoints, log).

    Ctrl-C or SIGTERM stops the run: it is marked failed at its last step, the workers shut down,
    and the exit code is 130 or 143; `--resume` continues it from its last checkpoint."""
    quiet_libraries()
    run = None
    with stop_signals():
        try:
            loaded, origin = _recipe(recipe, set_, resume)
            check_runtime(loaded, origin)
            from hflow.trainer.control.inputs import check_inputs

            check_inputs(loaded)
            # torch and the rest load only now: a mistake in the recipe, a model folder or a data row is
            # reported in about a second.
            from hflow.trainer.api.launch import prepare
            from hflow.trainer.rundir.writer import RunDir

            algorithm, loaded = prepare(loaded, output_dir, resume=resume is not None, checked=True)
            run = RunDir.reopen(resume, loaded) if resume is not None else RunDir.create(loaded, output_dir)
            run.ray_address = ray_address
            typer.echo(f"run directory: {run.path}", err=True)
            if resume is not None and finished(run, loaded):
                run.close()
            else:
                _run(algorithm, loaded, run)
        except BaseException as err:
            if not is_stop(err):
                raise
            # One line, no traceback (train.log has it): the run can be continued.
            where = (f" after step {run.read_status().get('step', 0)}; continue with: hflow train --resume "
                     f"{run.path}") if run else " before the run started"
            typer.echo(f"error: {stop_message(err)}{where}", err=True)
            raise typer.Exit(stop_exit_code(err)) from None
    typer.echo(str(run.path))


def _recipe(recipe: Optional[str], set_: list[str], resume: Optional[Path]) -> tuple[Recipe, str]:
    """The recipe to run and where it came from: the run's own on --resume, else RECIPE."""
    if resume is not None:
        if recipe is not None:
            raise UserError(f"train: --resume {resume} continues with the run's own recipe ({resume / RECIPE}); "
                            f"drop {recipe!r} (what may change on resume goes in --set: {settable()})")
        return resume_recipe(resume, set_), str(resume / RECIPE)
    if recipe is None:
        raise UserError("train: give a RECIPE (a file or a shipped name such as grpo/quickstart) or --resume RUN_DIR")
    loaded, path = load_recipe(recipe, set_)
    return loaded, str(path)


def _run(algorithm, recipe: Recipe, run: RunDir) -> None:
    """Run the algorithm to its end (`api/launch.run_to_end`); a worker's failure is one line here
    (its traceback is in train.log and the Ray logs)."""
    from hflow.trainer.api.launch import run_to_end

    try:
        run_to_end(algorithm, recipe, run)
    except RunFailed as err:
        typer.echo(f"error: {err} (run directory: {run.path})", err=True)
        raise typer.Exit(err.exit_code) from None
