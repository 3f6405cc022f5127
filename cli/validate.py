"""`hflow validate RECIPE`: check a recipe against the schema without training."""

from __future__ import annotations

from typing import Annotated

import typer

from hflow.trainer.config.load import check_runtime, load_recipe


def validate(
    recipe: Annotated[str, typer.Argument(help="Recipe file, or a shipped recipe name like grpo/quickstart.")],
    set_: Annotated[list[str], typer.Option("--set", help="Override a key: --set trainer.total_steps=20.")] = [],
) -> None:
    """Check RECIPE (keys, types, values, and that this machine can run its generation engine) and
    print 'ok' with its algorithm and model."""
    loaded, path = load_recipe(recipe, set_)
    check_runtime(loaded, str(path))
    typer.echo(f"ok: {path} ({loaded.algorithm}, model {loaded.model.path})")
