"""Continuing a run from its directory (`hflow train --resume`, `hflow.train(resume=...)`): the
run's own recipe, unedited since it began, with only the overrides that leave its math alone."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe, parse_overrides, read_yaml
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.layout import FINAL, RECIPE

if TYPE_CHECKING:
    from hflow.trainer.rundir.writer import RunDir

# What --set may change on --resume: keys that do not alter the run's math.
ENV_PREFIX = Recipe.model_config["env_prefix"]  # HFLOW_: recipe keys from the environment
RESUME_SETTABLE = ("trainer.total_steps", "trainer.save_every", "trainer.keep_checkpoints", "logging.",
                   "trainer.eval_every", "eval.", "data.eval",  # evaluation never changes the training
                   "trainer.on_nonfinite")  # a run that stopped at a NaN reward may go on skipping such steps
# ... and keys set to a value that only narrows what the run trusts (a run directory from someone
# else may turn trust_remote_code on for a model inside it, or run model-written code unsandboxed).
RESUME_NARROWING = {"model.trust_remote_code": (False,), "rollout.sandbox": ("bwrap",)}


def resume_recipe(run_dir: Path, set_: list[str]) -> Recipe:
    """The run's own recipe.yaml, unedited since the run began (`recipe_file.check_unedited`), with
    the --set and HFLOW_ overrides a resume allows."""
    from hflow.trainer.rundir.recipe_file import check_unedited

    saved = run_dir / RECIPE
    if not saved.is_file():
        raise UserError(f"--resume {run_dir}: not a run directory (no {RECIPE})")
    data = read_yaml(saved)
    check_unedited(run_dir, data)
    for pair in set_:
        key, _, value = pair.partition("=")
        if not may_change(key, value):
            raise UserError(f"--set {key}: cannot change on --resume (it would change the run's math); "
                            f"allowed: {settable()}")
    for var in sorted(os.environ):
        key = var.removeprefix(ENV_PREFIX).lower().replace("__", ".")
        # Only variables that name a recipe key are read as one (not HFLOW_CPU_PRODUCTS, say).
        in_recipe = key.split(".", 1)[0] in Recipe.model_fields
        if var.startswith(ENV_PREFIX) and in_recipe and not may_change(key, os.environ[var]):
            raise UserError(f"environment variable {var}: cannot change {key} on --resume (it would change the "
                            f"run's math); unset it (what may change: {settable()}, by --set or {ENV_PREFIX}...)")
    recipe = build_recipe(data, parse_overrides(set_), str(saved))
    if recipe.model.trust_remote_code:
        print(f"note: {saved} sets model.trust_remote_code: true, so code shipped with {recipe.model.path} "
              "runs; for a run directory from someone else add --set model.trust_remote_code=false", file=sys.stderr)
    return recipe


def may_change(key: str, value: str) -> bool:
    """Whether --set KEY=VALUE (or its HFLOW_ variable) may apply on --resume."""
    key = key.strip()
    if key.startswith(RESUME_SETTABLE):
        return True
    parsed = parse_overrides([f"v={value}"])["v"]
    return any(parsed == v and type(parsed) is type(v) for v in RESUME_NARROWING.get(key, ()))


def settable() -> str:
    keys = [k + ("*" if k.endswith(".") else "") for k in RESUME_SETTABLE]
    narrowing = [f"{k}={str(v).lower()}" for k, values in RESUME_NARROWING.items() for v in values]
    return ", ".join(keys + narrowing)


def finished(run: RunDir, recipe: Recipe) -> bool:
    """True, and one line saying so, when the resumed run has trained every step asked for already
    and exported final/: nothing is started or rewritten."""
    status = run.read_status()
    total = recipe.trainer.total_steps
    done = status.get("status") == "finished" and status.get("step", 0) >= total and (run.path / FINAL).is_dir()
    if done:
        print(f"note: {run.path} finished all {total} steps already, nothing to do (to train further: "
              f"hflow train --resume {run.path} --set trainer.total_steps=N, N > {total})", file=sys.stderr)
    return done
