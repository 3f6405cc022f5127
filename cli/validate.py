"""`hflow validate RECIPE`: check a recipe and its inputs without training."""

from __future__ import annotations

from typing import Annotated

import typer

from hflow.trainer.config.load import load_recipe
from hflow.trainer.control.preflight import check_runtime


def validate(
    recipe: Annotated[str, typer.Argument(help="Recipe file, or a shipped recipe name like grpo/quickstart.")],
    set_: Annotated[list[str], typer.Option("--set", help="Override a key: --set trainer.total_steps=20.")] = [],
    inputs: Annotated[bool, typer.Option(
        "--inputs/--no-inputs", help="Also check the model folders and data files the recipe names "
        "(--no-inputs: only the recipe, e.g. before the data is prepared).")] = True,
) -> None:
    """Check RECIPE (keys, types, values, that this machine can run its generation engine, and
    that its local model folders and data files are readable, as `hflow train` does before it
    starts) and print 'ok' with its algorithm and model."""
    loaded, path = load_recipe(recipe, set_)
    check_runtime(loaded, str(path))
    if inputs:
        from hflow.trainer.control.inputs import check_inputs

        check_inputs(loaded)  # before torch loads (a recipe with LoRA targets loads it to check them)
    typer.echo(f"ok: {path} ({loaded.algorithm}, model {loaded.model.path})")
