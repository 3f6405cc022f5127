"""The recipe's inputs on disk, checked before a run directory is made for them.

`hflow train` and `hflow validate` call `check_inputs` before torch loads: every local model folder
the roles load (`model_folders.py`), the LoRA target modules against the model's layers (the one
check that loads torch and transformers, and only for a recipe with LoRA), the sandbox of an
environment that runs model-written code (`tools.sandbox`), and every row of the prompt files
(`trainer/data/rows.py`, `row_checks.py`). A mistake in any of them is one line in about a second;
nothing is loaded into a model or tokenizer. `launch.prepare` calls it too (the Python API).
`hflow eval` checks what it reads the same way (`check_eval_inputs`).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

from hflow.engine import columns as col
from hflow.engine.rollout import code_tool
from hflow.engine.rollout.code_tool import UNSANDBOXED_WARNING, SandboxSettings, env_runs_code
from hflow.engine.rollout.environment import load_env_class
from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.model_folders import check_model_folders
from hflow.trainer.data.eval_sets import read_set_rows
from hflow.trainer.data.rows import read_eval_rows, read_rows
from hflow.trainer.data.rewards import load_reward_fn
from hflow.trainer.reward_defaults import BUILTIN_NAMES

log = logging.getLogger("hflow.sandbox")


def check_inputs(recipe: Recipe) -> None:
    """Stop with one line (a UserError) on a missing or broken model folder or prompt file."""
    check_model_folders(recipe)
    for role, (_, path) in recipe.role_model_keys().items():
        _check_lora_targets(recipe, role, path)
    if recipe.rollout.env:
        env_cls = load_env_class(recipe.rollout.env)  # a bad import path stops here, before any worker starts
        _check_code_sandbox(recipe, env_cls)
    rows = read_rows(recipe.data, recipe.seed, scoring_functions(recipe))
    _check_callable_on(recipe, rows[0])
    _check_eval_rows(recipe)


def check_eval_inputs(recipe: Recipe) -> None:
    """What `hflow eval` reads, checked as `check_inputs` checks it, before torch loads: the actor's
    and the reward's model folders, and the rows of `data.eval` and `eval.sets` with the reward
    function that scores them."""
    check_model_folders(recipe, roles=("actor", "reward"))
    rows = _check_eval_rows(recipe)
    if recipe.data.eval:  # its rows come first; the sets' may be scored by extraction instead
        _check_callable_on(recipe, rows[0], keys=("reward.function",))


def _check_eval_rows(recipe: Recipe) -> list[dict]:
    """The held-out rows (`data.eval`'s, then each of `eval.sets`'), each checked for the columns
    the reward function reads."""
    reward = scoring_functions(recipe).get("reward.function")
    rows = read_eval_rows(recipe.data, reward, recipe.seed) if recipe.data.eval else []
    for held_out in recipe.eval.sets:
        rows += read_set_rows(held_out, reward, recipe.seed)
    return rows


def _check_callable_on(recipe: Recipe, row: dict, keys: tuple[str, ...] | None = None) -> None:
    """Each scoring function the recipe names as module:function (of `keys`, when given) imported
    now (a misspelt module or function stops here, not in a worker) and checked to accept
    fn(prompts, responses, **columns) with the data's columns (a function without **kwargs that
    does not name every column would fail at the first step)."""
    columns = sorted(k for k in row if k != col.PROMPT)
    for key, spec in scoring_functions(recipe).items():
        if spec in BUILTIN_NAMES or (keys is not None and key not in keys):
            continue
        fn = load_reward_fn(spec, key)
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # no signature to read (a C function): it is called as it is
            continue
        try:
            signature.bind([], [], **{c: [] for c in columns})
        except TypeError as err:
            raise UserError(f"{key} {spec!r}: cannot be called as fn(prompts, responses, **columns) with the "
                            f"data's columns ({', '.join(columns) or 'none'}): {err}; name each column as a "
                            "parameter or add **kwargs") from None


def _check_code_sandbox(recipe: Recipe, env_cls: type) -> None:
    """An environment that runs model-written code needs its sandbox (`tools.sandbox`): bwrap
    installed and working here, checked now rather than at the first tool call; `none` is a warning."""
    if not env_runs_code(env_cls):
        return
    settings = SandboxSettings(recipe.tools.sandbox, recipe.tools.sandbox_url)
    if settings.kind == "none":
        log.warning("warning: %s (rollout.env %r)", UNSANDBOXED_WARNING, recipe.rollout.env)
    problem = code_tool.check(settings)
    if problem:
        raise UserError(problem)


def _check_lora_targets(recipe: Recipe, role: str, path: str) -> None:
    """A LoRA target module the role's model lacks, named before any worker loads it."""
    section = {"actor": "actor", "critic": "critic", "cost_critic": "critic"}.get(role)
    lora = getattr(recipe, section).lora if section else None
    if lora is None or not Path(path, "config.json").is_file():
        return
    from hflow.engine.models.lora import check_folder_targets  # torch and transformers: only with LoRA

    targets = lora.target_modules if isinstance(lora.target_modules, str) else tuple(lora.target_modules)
    check_folder_targets(path, targets, section, causal_lm=role == "actor",
                         trust_remote_code=recipe.model.trust_remote_code)


def scoring_functions(recipe: Recipe) -> dict[str, str]:
    """The scoring functions the run calls on data rows, by recipe key (a section given a model
    instead calls none): {"reward.function": "synthetic"}."""
    found = {}
    for section in ("reward", "cost"):
        cfg = getattr(recipe, section)
        if section in recipe.algorithm_spec.roles and not cfg.model and cfg.function:
            found[f"{section}.function"] = cfg.function
    return found
