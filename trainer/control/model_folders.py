"""The recipe's model folders, checked before torch loads.

A missing or broken model folder is the commonest mistake in a recipe. `hflow train` and `hflow
validate` check every local folder the roles load (`engine/models/folder.py`: config, tokenizer,
weight headers) and every hub id against the local cache or the hub, with nothing heavier than
json imported, so the error line comes in about a second instead of after torch and transformers
have loaded (6.6 s on the 2-core development machine for a mistyped `model.path`). `inputs.py`
checks the rest of the inputs (prompt files, scoring functions, LoRA targets) after it.
"""

from __future__ import annotations

from pathlib import Path

from hflow.engine.models.folder import check_model_source, hub_problem
from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe

# Roles whose workers load their own folder's tokenizer (workers/actor.py, workers/reward.py);
# the reference and the critics read the actor's token ids.
OWN_TOKENIZER = ("actor", "reward", "cost")


def check_model_folders(recipe: Recipe, roles: tuple[str, ...] | None = None) -> None:
    """Stop with one line (a UserError) on a missing or broken model folder, or a hub id that cannot
    be loaded now, of every role the recipe runs (or of `roles` among them)."""
    for role, (key, path) in recipe.role_model_keys().items():
        if roles is not None and role not in roles:
            continue
        if recipe.model.init and path == recipe.model.path and not Path(path).exists():
            continue  # `hflow train` builds it (model.init)
        check_model_source(path, key, tokenizer=role in OWN_TOKENIZER)
        if not Path(path).exists() and (problem := hub_problem(path)):
            raise UserError(f"{key}: '{path}' {problem}; give a local model folder (`hflow init-model "
                            "smollm2-135m-instruct DIR` builds one offline), or download it first where there is a "
                            "network (`huggingface-cli download ID`)")
