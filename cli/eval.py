"""`hflow eval RECIPE --checkpoint DIR`: score a checkpoint or an exported model on the recipe's eval set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.errors import UserError
from hflow.trainer.api.checkpoint import checkpoint_source
from hflow.trainer.config.load import load_recipe
from hflow.trainer.control.preflight import check_runtime


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
    if not loaded.data.eval:
        raise UserError(f"{path}: data.eval is not set; give the eval prompts, e.g. --set data.eval=synthetic:TASK "
                        "or a .jsonl file")
    check_runtime(loaded, str(path), roles=["actor", "reward"])  # what evaluate_model starts
    ckpt, step = checkpoint_source(checkpoint, loaded)
    from hflow.trainer.control.evaluate import evaluate_model  # torch: only once the recipe is right

    metrics = evaluate_model(loaded, ckpt, step)
    for key, value in metrics.items():
        typer.echo(f"{key} {value:.4f}")
