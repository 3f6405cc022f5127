"""`hflow train RECIPE`: run a recipe; the run directory is printed as the last line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.errors import RunFailed, UserError
from hflow.trainer.config.load import build_recipe, load_recipe, parse_overrides, read_yaml
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.preflight import check_runtime
from hflow.trainer.stop import is_stop, stop_exit_code, stop_message, stop_signals
from hflow.trainer.rundir.layout import FINAL, RECIPE

if TYPE_CHECKING:
    from hflow.trainer.rundir.writer import RunDir

# What --set may change on --resume: keys that do not alter the run's math.
ENV_PREFIX = Recipe.model_config["env_prefix"]  # HFLOW_: recipe keys from the environment
RESUME_SETTABLE = ("trainer.total_steps", "trainer.save_every", "trainer.keep_checkpoints", "logging.",
                   "trainer.eval_every", "eval.", "data.eval",  # evaluation never changes the training
                   "trainer.on_nonfinite")  # a run that stopped at a NaN reward may go on skipping such steps
# ... and keys set to a value that only narrows what the run trusts (a run directory from someone
# else may turn trust_remote_code on for a model inside it, or run model-written code unsandboxed).
RESUME_NARROWING = {"model.trust_remote_code": (False,), "rollout.sandbox": ("bwrap",)}


def train(
    recipe: Annotated[Optional[str], typer.Argument(
        help="Recipe file, or a shipped recipe name like grpo/quickstart (optional with --resume).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a key: --set trainer.total_steps=20.")] = [],
    output_dir: Annotated[Optional[Path], typer.Option(
        help="Folder for the run directory (default: the recipe's trainer.output_dir).")] = None,
    resume: Annotated[Optional[Path], typer.Option(
        help="Continue the run in this run directory from its last checkpoint.")] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        help="Run the workers on an existing Ray cluster: 'auto' or HOST:PORT. Without it, a local "
        "Ray instance is started when the placement needs the ray backend.")] = None,
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
            # torch and the rest load only now: a mistake in the recipe is reported in a fraction of a second.
            from hflow.trainer.api.launch import prepare
            from hflow.trainer.rundir.writer import RunDir

            algorithm, loaded = prepare(loaded, output_dir, resume=resume is not None)
            run = RunDir.reopen(resume, loaded) if resume is not None else RunDir.create(loaded, output_dir)
            run.ray_address = ray_address
            typer.echo(f"run directory: {run.path}", err=True)
            if resume is not None and _finished(run, loaded):
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


def _finished(run: RunDir, recipe: Recipe) -> bool:
    """True, and one line saying so, when the resumed run has trained every step asked for already
    and exported final/: nothing is started or rewritten."""
    status = run.read_status()
    total = recipe.trainer.total_steps
    done = status.get("status") == "finished" and status.get("step", 0) >= total and (run.path / FINAL).is_dir()
    if done:
        typer.echo(f"note: {run.path} finished all {total} steps already, nothing to do (to train further: "
                   f"hflow train --resume {run.path} --set trainer.total_steps=N, N > {total})", err=True)
    return done


def _recipe(recipe: Optional[str], set_: list[str], resume: Optional[Path]) -> tuple[Recipe, str]:
    """The recipe to run and where it came from: the run's own on --resume, else RECIPE."""
    if resume is not None:
        if recipe is not None:
            raise UserError(f"train: --resume {resume} continues with the run's own recipe ({resume / RECIPE}); "
                            f"drop {recipe!r} (what may change on resume goes in --set: {_settable()})")
        return _resume_recipe(resume, set_), str(resume / RECIPE)
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


def _resume_recipe(run_dir: Path, set_: list[str]) -> Recipe:
    """The run's own recipe.yaml, unedited since the run began (`recipe_file.check_unedited`), with
    the --set and HFLOW_ overrides a resume allows."""
    from hflow.trainer.rundir.recipe_file import check_unedited

    saved = run_dir / RECIPE
    if not saved.is_file():
        raise UserError(f"--resume {run_dir}: not a run directory (no {RECIPE})")
    data = read_yaml(saved)
    check_unedited(run_dir, data)
    for pair in set_:
        key, _, value = pair.partition("=")
        if not _may_change(key, value):
            raise UserError(f"--set {key}: cannot change on --resume (it would change the run's math); "
                            f"allowed: {_settable()}")
    for var in sorted(os.environ):
        key = var.removeprefix(ENV_PREFIX).lower().replace("__", ".")
        if var.startswith(ENV_PREFIX) and not _may_change(key, os.environ[var]):
            raise UserError(f"environment variable {var}: cannot change {key} on --resume (it would change the "
                            f"run's math); unset it (what may change: {_settable()}, by --set or {ENV_PREFIX}...)")
    recipe = build_recipe(data, parse_overrides(set_), str(saved))
    if recipe.model.trust_remote_code:
        typer.echo(f"note: {saved} sets model.trust_remote_code: true, so code shipped with {recipe.model.path} "
                   "runs; for a run directory from someone else add --set model.trust_remote_code=false", err=True)
    return recipe


def _may_change(key: str, value: str) -> bool:
    """Whether --set KEY=VALUE (or its HFLOW_ variable) may apply on --resume."""
    key = key.strip()
    if key.startswith(RESUME_SETTABLE):
        return True
    parsed = parse_overrides([f"v={value}"])["v"]
    return any(parsed == v and type(parsed) is type(v) for v in RESUME_NARROWING.get(key, ()))


def _settable() -> str:
    keys = [k + ("*" if k.endswith(".") else "") for k in RESUME_SETTABLE]
    narrowing = [f"{k}={str(v).lower()}" for k, values in RESUME_NARROWING.items() for v in values]
    return ", ".join(keys + narrowing)
