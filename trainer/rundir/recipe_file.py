"""The run's own recipe: `recipe.yaml`, fully resolved, and `recipe.sha256`, its hash.

The hash is of the recipe's content (the YAML parsed, then written as canonical JSON): a comment
or a blank line does not change it, any value does. `RunDir.commit_checkpoint` keeps it in every
checkpoint's trainer_state.json too, so that a resume refuses a recipe.yaml edited after the run
started: a changed learning rate or temperature would otherwise apply without a word, and the run
would no longer be the one its events describe. What may change on resume goes through `--set`
(`cli/train.py`), which leaves recipe.yaml as it is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import yaml

from hflow.errors import UserError
from hflow.trainer.config.load import dump_recipe
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir import files
from hflow.trainer.rundir.layout import CHECKPOINTS, RECIPE, RECIPE_HASH, TRAINER_STATE

HASH_KEY = "recipe_sha256"  # in a checkpoint's trainer_state.json


def recipe_digest(data: dict[str, Any]) -> str:
    """sha256 of a parsed recipe's canonical JSON (keys sorted, no spaces)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_recipe(run_dir: Path, recipe: Recipe) -> str:
    """Write `recipe.yaml` and `recipe.sha256` into a new run directory; returns the hash."""
    text = dump_recipe(recipe)
    digest = recipe_digest(yaml.safe_load(text))
    files.atomic_write(run_dir / RECIPE, text)
    files.atomic_write(run_dir / RECIPE_HASH, digest + "\n")
    return digest


def check_unedited(run_dir: Path, data: dict[str, Any]) -> str:
    """The hash of `data` (the run's recipe.yaml, parsed); a UserError when it differs from the hash
    recorded in recipe.sha256 or in any checkpoint. A run written before hflow recorded hashes has
    none to compare with, and resumes as it did."""
    digest = recipe_digest(data)
    for where, recorded in _recorded(run_dir):
        if recorded != digest:
            raise UserError(
                f"--resume {run_dir}: {run_dir / RECIPE} was edited after the run started (its hash is not the one "
                f"in {where}); a resume continues the run as it was: undo the edit, or start a new run with the "
                f"edited recipe (hflow train {run_dir / RECIPE}); what may change on resume goes in --set")
    return digest


def _recorded(run_dir: Path) -> Iterator[tuple[str, str]]:
    """(where, hash) of each hash recorded in the run directory."""
    try:
        yield RECIPE_HASH, (run_dir / RECIPE_HASH).read_text().strip()
    except FileNotFoundError:
        pass
    except OSError as err:
        raise UserError(f"--resume {run_dir}: cannot read {run_dir / RECIPE_HASH} ({err.strerror})") from None
    for checkpoint in sorted((run_dir / CHECKPOINTS).glob("step_*")):
        try:
            state = json.loads((checkpoint / TRAINER_STATE).read_text())
        except (OSError, ValueError):
            continue  # a damaged checkpoint: `checkpoints.verify` skips it
        if isinstance(state, dict) and isinstance(state.get(HASH_KEY), str):
            yield f"{CHECKPOINTS}/{checkpoint.name}/{TRAINER_STATE}", state[HASH_KEY]
