"""The `hflow` command: a thin typer app; each command lives in its own module."""

from __future__ import annotations

import sys

import typer

from hflow.cli import eval as eval_command
from hflow.cli import import_gguf, init_model, recipes, runs, train, validate
from hflow.cli.bench import bench
from hflow.cli.map import map as map_command
from hflow.cli.monitor import monitor
from hflow.errors import UserError
from hflow.trainer.config.algorithm_sections import ALGORITHMS

app = typer.Typer(
    name="hflow",
    help=f"hflow: RL training of language models ({', '.join(ALGORITHMS)}) on a single controller with "
         "hybrid-engine workers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # a docstring's wrapped lines flow as one paragraph at any width
)


def _register() -> None:
    app.command()(train.train)
    app.command()(validate.validate)
    app.command("init-model")(init_model.init_model)
    app.command("import-gguf")(import_gguf.import_gguf)
    app.command("eval")(eval_command.eval_)
    app.add_typer(recipes.app, name="recipes")
    app.command()(monitor)
    app.command()(runs.runs)

    app.command()(bench)
    app.command("map")(map_command)


_register()


def main() -> None:
    """Console entry point: user mistakes print one line and exit 2; bugs keep their traceback."""
    try:
        app()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
