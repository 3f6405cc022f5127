"""`hflow eval RECIPE [--checkpoint DIR] [--compare OTHER]`: score a model on the recipe's eval sets,
alone (each metric with its 95% interval) or against another on the same prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.trainer.config.load import load_recipe

HOW_TO_SET = "--set data.eval=synthetic:TASK"


def eval_(
    recipe: Annotated[str, typer.Argument(help="Recipe file, or a shipped recipe name like grpo/smollm2-arithmetic.")],
    checkpoint: Annotated[Optional[Path], typer.Option(
        help="A run folder (its final model, else its newest whole checkpoint), a run's checkpoint "
             "(RUN/checkpoints/step_N) or a Hugging Face model directory (RUN/final). Default: the "
             "recipe's model.path, the base model.")] = None,
    compare: Annotated[Optional[str], typer.Option(
        help="Also score this model (a checkpoint as above, or `base`) on the same prompts with the same seeds, "
             "and print each metric of both with the difference and its 95% interval.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a key: --set eval.n=4.")] = [],
) -> None:
    """Evaluate a model on the recipe's `data.eval` and `eval.sets` with its `eval` sampling, reward
    and engine. Alone, one metric per line: its name, its value and its 95% interval over the
    prompts (eval/accuracy, eval/pass@n, eval/response_length, eval/cutoff_share, ...; a set's
    under eval/NAME/). With --compare, a table: each metric of the two models, the difference and
    its paired-bootstrap 95% interval: a gain whose interval holds 0 is not told apart from noise."""
    quiet_libraries()
    loaded, path = load_recipe(recipe, set_)
    from hflow.trainer.api.evaluation import BASE, compare_loaded  # torch: only once the recipe is right

    if compare is None:
        _print_alone(loaded, str(path), checkpoint)
        return
    rows = compare_loaded(loaded, str(path), checkpoint, compare, HOW_TO_SET)
    a_name, b_name = str(checkpoint or BASE), compare
    width = max(len(r.metric) for r in rows)
    typer.echo(f"{'metric':<{width}}  {'A':>8}  {'B':>8}  {'A - B':>8}  95% interval of A - B")
    for r in rows:
        typer.echo(f"{r.metric:<{width}}  {r.a:8.4f}  {r.b:8.4f}  {r.difference:+8.4f}  [{r.low:+.4f}, {r.high:+.4f}]")
    typer.echo(f"A: {a_name}; B: {b_name}; the same {', '.join(sorted({str(r.prompts) for r in rows}))} prompts "
               "per set, paired bootstrap over prompts (2,000 resamples)")


def _print_alone(loaded, origin: str, checkpoint: Path | None) -> None:
    from hflow.trainer.api.evaluation import outcomes_of

    outcomes, _ = outcomes_of(loaded, origin, checkpoint, HOW_TO_SET)
    from hflow.trainer.report.intervals import interval  # torch: once the inputs are checked

    for prefix, metrics in outcomes.items():
        for name, values in metrics.items():
            line = f"{prefix}{name} {float(values.float().mean()):.4f}"
            if len(values) > 1:  # per prompt; a run-level figure (tool-call share) has no interval
                low, high = interval(values)
                line += f" 95% {low:.4f}-{high:.4f}"
            typer.echo(line)
