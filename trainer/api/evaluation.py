"""`hflow.evaluate` and `hflow.compare`: the command line's `eval` and `eval --compare` as Python
functions.

    hflow.evaluate("grpo/smollm2-arithmetic")                        # the base model (model.path)
    hflow.evaluate("grpo/smollm2-arithmetic", "runs/<run>")          # a run's final model
    for row in hflow.compare("grpo/smollm2-arithmetic", "runs/<run>", "base"):
        print(row.metric, row.a, row.b, row.difference, row.low, row.high)

A checkpoint is a run folder (its final model, else its newest whole checkpoint), a run's
checkpoint (RUN/checkpoints/step_N) or a model directory; None or "base" is the recipe's own
`model.path`, scored with the seeds of training's step-0 evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hflow.errors import UserError
from hflow.trainer.api.checkpoint import checkpoint_source
from hflow.trainer.api.sources import override_pairs, recipe_from
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.preflight import check_runtime

BASE = "base"  # names the recipe's own model.path where a checkpoint is asked for
HOW_TO_SET_API = "overrides={'data.eval': 'synthetic:TASK'}"  # how to name eval prompts, in this API's terms


@dataclass(frozen=True)
class Comparison:
    """One metric of two models on the same prompts: their values with 95% intervals, and the
    difference a - b with its paired-bootstrap 95% interval (`trainer/report/intervals.py`)."""

    metric: str
    a: float
    a_interval: tuple[float, float]
    b: float
    b_interval: tuple[float, float]
    difference: float
    low: float
    high: float
    prompts: int


def evaluate(recipe: str | Path | dict, checkpoint: str | Path | None = None, *,
             overrides: dict[str, Any] | None = None) -> dict[str, float]:
    """eval/* of `checkpoint` (None: the recipe's model.path) on the recipe's `data.eval` and
    `eval.sets` with its `eval` sampling, reward and engine, as `hflow eval` prints them."""
    loaded, origin = recipe_from(recipe, override_pairs(overrides))
    return evaluate_loaded(loaded, origin, checkpoint, HOW_TO_SET_API)


def evaluate_loaded(loaded: Recipe, origin: str, checkpoint: str | Path | None, how_to_set: str) -> dict[str, float]:
    """`evaluate` of a loaded recipe (`hflow eval` loads it from the command line); `how_to_set`
    says, in the caller's terms, how to give data.eval when it is missing."""
    from hflow.trainer.control.evaluate import means

    return means(outcomes_of(loaded, origin, checkpoint, how_to_set)[0])


def outcomes_of(loaded: Recipe, origin: str, checkpoint, how_to_set: str) -> tuple[dict, int]:
    """`evaluate_loaded`'s per-prompt values (`Evaluator.outcomes`) and the step of their seeds."""
    return _outcomes(loaded, origin, checkpoint, how_to_set, None)


def compare(recipe: str | Path | dict, a: str | Path | None, b: str | Path | None = BASE, *,
            overrides: dict[str, Any] | None = None) -> list[Comparison]:
    """Every eval/* metric of `a` against `b` (each a checkpoint, or None / "base" for the recipe's
    model.path), both scored on the same prompts with the same seeds."""
    loaded, origin = recipe_from(recipe, override_pairs(overrides))
    return compare_loaded(loaded, origin, a, b, HOW_TO_SET_API)


def compare_loaded(loaded: Recipe, origin: str, a, b, how_to_set: str) -> list[Comparison]:
    first, step = _outcomes(loaded.model_copy(deep=True), origin, a, how_to_set, None)
    second, _ = _outcomes(loaded.model_copy(deep=True), origin, b, how_to_set, step)
    from hflow.trainer.report.intervals import interval, paired_difference  # torch: loaded by now

    rows = []
    for prefix, values in first.items():
        for name, x in values.items():
            y = second[prefix][name]
            if len(x) != len(y) or len(x) < 2:  # a run-level figure (tool-call share), not per prompt
                continue
            difference, low, high = paired_difference(x, y)
            rows.append(Comparison(prefix + name, float(x.mean()), interval(x), float(y.mean()), interval(y),
                                   difference, low, high, len(x)))
    return rows


def _outcomes(loaded: Recipe, origin: str, checkpoint, how_to_set: str, step: int | None) -> tuple[dict, int]:
    """(the per-prompt outcomes of `checkpoint`, the step whose eval seeds drew them: its own, or
    `step` when given, so that a comparison's two sides draw alike)."""
    from hflow.trainer.control.inputs import check_eval_inputs

    if not (loaded.data.eval or loaded.eval.sets):
        raise UserError(f"{origin}: data.eval is not set and eval.sets is empty; give the eval prompts, e.g. "
                        f"{how_to_set} or a .jsonl file")
    check_runtime(loaded, origin, roles=["actor", "reward"])  # what evaluate_outcomes starts
    ckpt, own_step = (None, 0) if checkpoint in (None, BASE) else checkpoint_source(Path(checkpoint), loaded)
    check_eval_inputs(loaded)
    # torch and the rest load only now: a wrong checkpoint, model folder or eval row is one line in about a second.
    from hflow.trainer.control.evaluate import evaluate_outcomes

    if ckpt is None and loaded.model.init and not Path(loaded.model.path).exists():  # as `hflow train` builds it
        from hflow.engine.models.loading import build_tiny_model

        build_tiny_model(loaded.model.path, loaded.model.init, loaded.seed)
    used = own_step if step is None else step
    return evaluate_outcomes(loaded, ckpt, used), used
