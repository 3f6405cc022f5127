"""`hflow bench rollout|step|switch RECIPE`: measure a recipe's speed on this machine."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.trainer.config.load import load_recipe
from hflow.trainer.control.preflight import check_runtime


class What(str, Enum):
    rollout = "rollout"
    step = "step"
    switch = "switch"


def bench(
    what: Annotated[What, typer.Argument(help="rollout: generation alone; step: full RL steps; "
                                              "switch: the actor's train -> generate -> train switch.")],
    recipe: Annotated[str, typer.Argument(help="Recipe file, or a shipped recipe name like grpo/quickstart.")],
    set_: Annotated[list[str], typer.Option("--set", help="Override a key: --set rollout.n=8.")] = [],
    repeats: Annotated[int, typer.Option(min=1, help="Timed repetitions (rollout, switch) or RL steps (step).")] = 5,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Measure RECIPE: rollout tokens/s, full RL step tokens/s (prompt + response tokens of the
    global batch / step time, the HybridFlow paper's metric) with each phase's efficiency account
    (needed FLOPs and bytes, computed / needed, the time limit from this machine's measured peaks,
    added up over the parts of the phase's work that run in order, listed under it, the share of it
    reached), or the actor's phase switch time and each rank's memory across it."""
    quiet_libraries()
    loaded, path = load_recipe(recipe, set_)
    check_runtime(loaded, str(path), roles=None if what is What.step else ["actor"])
    # torch and the rest load only now: a mistake in the recipe is reported in a fraction of a second.
    from hflow.engine.models.loading import build_tiny_model
    from hflow.trainer.algorithms.registry import trainer_for
    from hflow.trainer.work import bench as measure
    from hflow.trainer.work.bench_account import table as account_table

    if loaded.model.init:
        from pathlib import Path

        if not Path(loaded.model.path).exists():
            build_tiny_model(loaded.model.path, loaded.model.init, loaded.seed)
    if what is What.rollout:
        result = measure.bench_rollout(loaded, repeats)
    elif what is What.step:
        result = measure.bench_step(loaded, max(2, repeats), trainer_for(loaded.algorithm))
    else:
        result = measure.bench_switch(loaded, repeats)
    result = {"what": what.value, "recipe": recipe, **result}
    if json_:
        typer.echo(json.dumps(result))
        return
    for key, value in result.items():
        if key == "account":
            continue
        if isinstance(value, float):
            value = f"{value:,.4g}"
        typer.echo(f"{key:24} {value}")
    if "account" in result:
        typer.echo("\nefficiency account (per phase: needed work, computed / needed, the least time this machine "
                   "allows, measured time, share of that limit; medians over the steps; indented, the parts of a "
                   "phase's work that run in order, each with its own limit):")
        for line in account_table(result["account"]):
            typer.echo(line)
