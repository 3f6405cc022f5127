"""`hflow.train`: the command line's `train` as a Python function (`hflow.evaluate`: `evaluation.py`).

    import hflow

    def score(prompts, responses, **columns):           # one float per response
        return [float(r.strip() == a) for r, a in zip(responses, columns["answer"])]

    run = hflow.train("grpo/quickstart", dataset=[{"prompt": "2 + 2 =", "answer": "4"}, ...],
                      reward=score, overrides={"trainer.total_steps": 20})
    run.metrics[-1]["reward/mean"], run.final_model
    hflow.evaluate(run.path / "recipe.yaml", run.path, overrides={"data.eval": "eval.jsonl"})

A user mistake raises `hflow.errors.UserError` with the command line's one-line message; the run
directory is written as `hflow train` writes it, and `hflow train --resume` continues it (with a
Python reward function, from Python: the function is given again)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

from hflow.engine.user_code import REGISTERED, REGISTERED_PREFIX
from hflow.errors import UserError
from hflow.trainer.api.run import Run
from hflow.trainer.api.sources import dataset_file, override_pairs, recipe_from, reward_callable, reward_spec
from hflow.trainer.config.load import read_yaml, resolve_recipe_path
from hflow.trainer.control.preflight import check_runtime
from hflow.trainer.rundir.layout import RECIPE


def train(recipe: str | Path | dict | None = None, *, overrides: dict[str, Any] | None = None,
          output_dir: str | Path | None = None, reward: str | Callable | Iterable[Callable] | None = None,
          reward_weights: list[float] | None = None, dataset: Any = None, resume: str | Path | None = None) -> Run:
    """Train with `recipe` (a file, a shipped name such as "grpo/quickstart", or a dict of sections)
    and return the finished run.

    overrides: dotted keys, {"trainer.total_steps": 5} (as `--set`); output_dir: the folder for the
    run directory (default: the recipe's `trainer.output_dir`); reward: `reward.function`, or a
    callable fn(prompts, responses, **columns) -> list[float], or several summed with
    `reward_weights` (TRL's reward_funcs); dataset: the prompts as a list of dicts, a pandas
    DataFrame or a datasets.Dataset, with a `data.prompt_key` column (written once, as JSON Lines,
    to OUTPUT_DIR/datasets/, and named by `data.train`); resume: a run directory to continue from
    its last checkpoint, with its own recipe (`recipe` and `dataset` not given; `overrides` only
    those a resume allows; a Python reward given again)."""
    from hflow.trainer.api.launch import prepare, run_to_end
    from hflow.trainer.rundir.writer import RunDir

    if resume is not None:
        return _resume(Path(resume), recipe, overrides, reward, reward_weights, dataset)
    if recipe is None:
        raise UserError("train: give a recipe (a file, a shipped name such as 'grpo/quickstart', or a dict) or resume=")
    pairs = override_pairs(overrides)
    if reward is not None:
        pairs.append(f"reward.function={json.dumps(reward_spec(reward, reward_weights))}")
    elif reward_weights is not None:
        raise UserError("reward_weights: give the reward functions they weigh (reward=[f, g])")
    if dataset is not None:
        folder = Path(output_dir or _output_dir(recipe, overrides)).absolute() / "datasets"
        pairs.append(f"data.train={json.dumps(str(dataset_file(dataset, folder)))}")
    loaded, origin = recipe_from(recipe, pairs)
    check_runtime(loaded, origin)
    algorithm, loaded = prepare(loaded, None if output_dir is None else Path(output_dir))
    run = RunDir.create(loaded, None if output_dir is None else str(output_dir))
    run_to_end(algorithm, loaded, run)
    return Run(run.path)


def _resume(run_dir: Path, recipe, overrides, reward, reward_weights, dataset) -> Run:
    from hflow.trainer.api.launch import prepare, run_to_end
    from hflow.trainer.api.resume import finished, resume_recipe
    from hflow.trainer.rundir.writer import RunDir

    if recipe is not None or dataset is not None:
        raise UserError(f"train: resume={run_dir} continues with the run's own recipe and rows; drop "
                        f"{'recipe' if recipe is not None else 'dataset'}")
    loaded = resume_recipe(run_dir, override_pairs(overrides))
    saved = loaded.reward.function or ""
    if reward is not None:
        if not saved.startswith(REGISTERED_PREFIX):
            raise UserError(f"reward: the run's reward.function is {saved!r}, which a resume keeps; give no reward")
        REGISTERED[saved] = reward_callable(reward, reward_weights)[0]  # the run's name for it, this process
    check_runtime(loaded, str(run_dir / RECIPE))
    algorithm, loaded = prepare(loaded, None, resume=True)
    run = RunDir.reopen(run_dir, loaded)
    if finished(run, loaded):
        run.close()
    else:
        run_to_end(algorithm, loaded, run)
    return Run(run.path)


def _output_dir(recipe: str | Path | dict, overrides: dict[str, Any] | None) -> str:
    """The recipe's `trainer.output_dir` before the recipe is built (the dataset goes there)."""
    if overrides and "trainer.output_dir" in overrides:
        return str(overrides["trainer.output_dir"])
    data = recipe if isinstance(recipe, dict) else read_yaml(resolve_recipe_path(str(recipe)))
    return str((data.get("trainer") or {}).get("output_dir") or "runs")
