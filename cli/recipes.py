"""`hflow recipes list|show|cp|keys`: the recipes shipped with hflow, and every key a recipe takes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from hflow.errors import UserError
from hflow.trainer.config.load import RECIPES_DIR, resolve_recipe_path, shipped_recipes

app = typer.Typer(help="List, print and copy the recipes shipped with hflow; list every recipe key.",
                  no_args_is_help=True)


@app.command("list")
def list_() -> None:
    """Print the name of every shipped recipe (use it with train, validate, show, cp)."""
    for name in shipped_recipes():
        typer.echo(name)


@app.command()
def show(name: Annotated[str, typer.Argument(help="Shipped recipe name, e.g. grpo/quickstart.")]) -> None:
    """Print a shipped recipe."""
    typer.echo(_shipped(name).read_text(), nl=False)


@app.command()
def cp(
    name: Annotated[str, typer.Argument(help="Shipped recipe name, e.g. grpo/quickstart.")],
    dest: Annotated[Path, typer.Argument(help="File or directory to copy it to.")],
) -> None:
    """Copy a shipped recipe to DEST for editing."""
    source = _shipped(name)
    target = dest / source.name if dest.is_dir() else dest
    if target.exists():
        raise UserError(f"{target}: already exists; choose another destination")
    if not target.parent.is_dir():
        raise UserError(f"{target.parent}: no such directory")
    shutil.copyfile(source, target)
    typer.echo(str(target))


@app.command()
def keys(section: Annotated[str, typer.Argument(help="Only this section, e.g. rollout or grpo.")] = None) -> None:
    """Print every recipe key (or SECTION's): type, default, which algorithms read it, and what it does."""
    from hflow.trainer.config.keys import recipe_keys

    for k in recipe_keys(section):
        typer.echo(f"{k.key}: {k.type} = {k.default}  [{k.read_by}]")
        if k.description:
            typer.echo(f"    {k.description}")


def _shipped(name: str) -> Path:
    path = resolve_recipe_path(name)
    if RECIPES_DIR not in path.resolve().parents:
        raise UserError(f"{name}: not a shipped recipe; see `hflow recipes list`")
    return path
