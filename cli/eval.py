"""`hflow eval RECIPE --checkpoint DIR`: score a checkpoint or an exported model on the recipe's eval set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.trainer.config.load import load_recipe


def eval_(
    recipe: Annotated[str, typer.Argument(help="Recipe file, or a shipped recipe name like grpo/smollm2-arithmetic.")],
    checkpoint: Annotated[Path, typer.Option(
        help="A run folder (its final model, else its newest whole checkpoint), a run's checkpoint "
             "(RUN/checkpoints/step_N) or a Hugging Face model directory (RUN/final).")],
    set_: Annotated[list[str], typer.Option("--set", help="Override a key: --set eval.n=4.")] = [],
) -> None:
    """Evaluate DIR on the recipe's `data.eval` with its `eval` sampling, reward and engine; print
    eval/reward, eval/accuracy (share of responses with reward >= 1), eval/pass@n (eval.n > 1),
    eval/response_length and, for tool environments (rollout.env), eval/tool_call_share, one per line."""
    quiet_libraries()
    loaded, path = load_recipe(recipe, set_)
    from hflow.trainer.api.train import evaluate_loaded  # torch: only once the recipe is right

    for key, value in evaluate_loaded(loaded, str(path), checkpoint, "--set data.eval=synthetic:TASK").items():
        typer.echo(f"{key} {value:.4f}")
