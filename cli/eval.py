"""`hflow eval RECIPE --checkpoint DIR`: score a checkpoint or an exported model on the recipe's eval set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.errors import UserError
from hflow.trainer.config.load import load_recipe
from hflow.trainer.control.preflight import check_runtime
from hflow.trainer.rundir.layout import CHECKPOINTS, COMPLETE, FINAL, TRAINER_STATE


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
    ckpt, step = _source(checkpoint, loaded)
    from hflow.trainer.control.evaluate import evaluate_model  # torch: only once the recipe is right

    metrics = evaluate_model(loaded, ckpt, step)
    for key, value in metrics.items():
        typer.echo(f"{key} {value:.4f}")


def _source(directory: Path, recipe) -> tuple[str | None, int]:
    """(checkpoint for the actor or None, step) of DIR; a model directory becomes `model.path`. A
    checkpoint is verified first, as a resume does (`checkpoints.verify`): a damaged one is one line.
    A run folder stands for its final model, or, before the run finished, its newest whole checkpoint."""
    directory = _in_run(directory)
    if any((directory / name).exists() for name in (TRAINER_STATE, COMPLETE, "actor")):
        _check_checkpoint(directory)
        return str(directory), int(json.loads((directory / TRAINER_STATE).read_text())["step"])
    if (directory / "config.json").is_file():
        recipe.model.path = str(directory)
        recipe.model.init = None
        return None, recipe.trainer.total_steps
    raise UserError(f"--checkpoint {directory}: not a checkpoint (RUN/checkpoints/step_N with trainer_state.json "
                    "and actor/) nor a model directory (with config.json)")


def _in_run(directory: Path) -> Path:
    """What to evaluate of DIR when it is a run folder (else DIR itself), said on stderr."""
    from hflow.trainer.rundir.checkpoints import newest_whole
    from hflow.trainer.rundir.read import is_run_dir

    if not is_run_dir(directory):
        return directory
    if (directory / FINAL / "config.json").is_file():
        chosen = directory / FINAL
    else:
        chosen, _ = newest_whole(sorted((directory / CHECKPOINTS).glob("step_*")))
        if chosen is None:
            raise UserError(f"--checkpoint {directory}: the run has no {FINAL}/ model and no whole checkpoint "
                            f"under {CHECKPOINTS}/ to evaluate")
    typer.echo(f"evaluating {chosen}", err=True)
    return chosen


def _check_checkpoint(directory: Path) -> None:
    from hflow.trainer.rundir.checkpoints import verify

    earlier = "evaluate an earlier checkpoint, or the run's final/"
    if not (directory / COMPLETE).is_file():
        raise UserError(f"--checkpoint {directory}: no {COMPLETE} marker, so the checkpoint was never finished "
                        f"(a crash or a full disk while it was written); {earlier}")
    problem = verify(directory)
    if problem:
        raise UserError(f"--checkpoint {directory}: the checkpoint is damaged: {problem}; {earlier}")
    if not (directory / "actor").is_dir():
        raise UserError(f"--checkpoint {directory}: the checkpoint has no actor/ folder; {earlier}")
