"""What `hflow.train` accepts besides a recipe file, turned into what a recipe holds: a recipe as a
dict, overrides as a dict of dotted keys, rows as a list of dicts / a pandas DataFrame / a Hugging
Face `datasets.Dataset` (written once to a JSON Lines file the recipe names), and reward functions
as Python callables (handed over in-process: `engine/user_code.py: register`)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable

from hflow.engine.user_code import register
from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe, load_recipe, locate_code, parse_overrides
from hflow.trainer.config.recipe import Recipe


def override_pairs(overrides: dict[str, Any] | None) -> list[str]:
    """{"trainer.total_steps": 5} as the command line's KEY=VALUE pairs (each value as JSON, which
    the recipe loader reads as YAML: numbers, strings, lists and mappings keep their types)."""
    if overrides is None:
        return []
    if not isinstance(overrides, dict):
        raise UserError(f"overrides: give a dict of dotted keys, e.g. {{'trainer.total_steps': 5}}; got "
                        f"{type(overrides).__name__}")
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


def recipe_from(recipe: str | Path | dict, pairs: list[str]) -> tuple[Recipe, str]:
    """The recipe (a file, a shipped name such as grpo/quickstart, or a dict of sections) with the
    overrides applied, and what errors call it."""
    if isinstance(recipe, dict):
        loaded = build_recipe(recipe, parse_overrides(pairs), "recipe dict")
        locate_code(loaded, [Path.cwd()])
        loaded.name = loaded.name or "python"
        return loaded, "recipe dict"
    if not isinstance(recipe, (str, Path)):
        raise UserError(f"recipe: give a recipe file, a shipped recipe name or a dict; got {type(recipe).__name__}")
    loaded, path = load_recipe(str(recipe), pairs)
    return loaded, str(path)


def rows_of(dataset: Any) -> list[dict]:
    """The rows of a list of dicts, a pandas DataFrame or a Hugging Face Dataset."""
    if hasattr(dataset, "to_dict") and hasattr(dataset, "columns"):  # pandas
        rows = dataset.to_dict(orient="records")
    elif hasattr(dataset, "to_list") and hasattr(dataset, "column_names"):  # datasets.Dataset
        rows = dataset.to_list()
    elif isinstance(dataset, (list, tuple)):
        rows = list(dataset)
    else:
        raise UserError(f"dataset: give a list of dicts, a pandas DataFrame or a datasets.Dataset; got "
                        f"{type(dataset).__name__}")
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise UserError(f"dataset row {bad}: a row is a dict of columns, got {type(rows[bad]).__name__}")
    if not rows:
        raise UserError("dataset: it has no rows")
    return rows


def dataset_file(dataset: Any, folder: Path) -> Path:
    """The rows written once as JSON Lines under `folder`, named by their content (the same rows
    give the same file, which is never rewritten: a run's `data.train` keeps meaning its rows)."""
    lines = []
    for i, row in enumerate(rows_of(dataset)):
        try:
            lines.append(json.dumps(row, default=_plain, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise UserError(f"dataset row {i}: cannot be written as JSON ({err})") from None
    text = "\n".join(lines) + "\n"
    path = folder / f"dataset-{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(".tmp")
        staging.write_text(text)
        staging.replace(path)
    return path


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (pandas and datasets hand them out) as Python values."""
    if hasattr(value, "tolist"):
        out = value.tolist()
        if isinstance(out, float) and not math.isfinite(out):
            raise ValueError(f"{out} is not a number JSON can hold")
        return out
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def reward_spec(reward: str | Callable | Iterable[Callable], weights: list[float] | None) -> str:
    """The recipe's `reward.function` for `reward`: a string as it is; a callable (or several,
    summed with `weights`, TRL's reward_funcs and reward_weights) handed over by name."""
    if isinstance(reward, str):
        if weights is not None:
            raise UserError("reward_weights: weigh several reward callables; a single reward takes none")
        return reward
    return register(*reward_callable(reward, weights))


def reward_callable(reward: Callable | Iterable[Callable], weights: list[float] | None) -> tuple[Callable, str]:
    """One callable for a callable or several (summed with `weights`), and its name."""
    fns = [reward] if callable(reward) else list(reward) if isinstance(reward, (list, tuple)) else []
    if not fns or not all(callable(f) for f in fns):
        raise UserError("reward: give a function name ('module:function'), a callable, or a list of callables")
    weights = [1.0] * len(fns) if weights is None else [float(w) for w in weights]
    if len(weights) != len(fns):
        raise UserError(f"reward_weights: {len(weights)} weights for {len(fns)} reward functions")
    if len(fns) == 1 and weights == [1.0]:
        return fns[0], _name(fns[0])
    return _Weighted(fns, weights), "+".join(_name(f) for f in fns)


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class _Weighted:
    """sum_k w_k f_k(prompts, responses, **columns), row by row (TRL's several reward functions)."""

    def __init__(self, fns: list[Callable], weights: list[float]):
        self.fns, self.weights = fns, weights

    def __call__(self, prompts, responses, **columns) -> list[float]:
        total = [0.0] * len(responses)
        for fn, w in zip(self.fns, self.weights):
            scores = list(fn(prompts, responses, **columns))
            if len(scores) != len(responses):
                raise ValueError(f"{_name(fn)} returned {len(scores)} scores for {len(responses)} responses")
            total = [t + w * float(s) for t, s in zip(total, scores)]
        return total
