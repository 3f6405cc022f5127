"""Reading a recipe: YAML file, then `HFLOW_...` environment variables, then `--set` overrides.

Every failure is a UserError of one line naming the file, the key, the bad value and
what would be accepted.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import PydanticBaseSettingsSource

from hflow.engine.user_code import REGISTERED_PREFIX
from hflow.errors import UserError
from hflow.trainer.config.other_names import other_name_hint
from hflow.trainer.config.recipe import Recipe, run_name_problem

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


def shipped_recipes() -> list[str]:
    """Names of the recipes shipped in the package, like `grpo/quickstart`."""
    return sorted(p.relative_to(RECIPES_DIR).with_suffix("").as_posix() for p in RECIPES_DIR.rglob("*.yaml"))


def resolve_recipe_path(spec: str) -> Path:
    """A recipe named by its path, or by its name inside the package (`grpo/quickstart`)."""
    path = Path(spec)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / (spec if spec.endswith(".yaml") else spec + ".yaml")
    if shipped.is_file():
        return shipped
    if path.exists():
        raise UserError(f"{spec}: is not a file; give a recipe .yaml file")
    close = difflib.get_close_matches(spec.removesuffix(".yaml"), shipped_recipes(), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else " (see `hflow recipes list`)"
    raise UserError(f"{spec}: no such recipe file or shipped recipe{hint}")


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`a.b=c` strings into a nested dict; values are parsed as YAML (`3`, `true`, `[1, 2]`)."""
    nested: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set trainer.total_steps=20")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"--set {pair!r}: '{part}' is set to a value and used as a section")
        node[parts[-1]] = value
    return nested


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{path}:{where} is not valid YAML: {problem}") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read recipe: {err.strerror}") from None
    if data is None:
        raise UserError(f"{path}: the recipe is empty; it needs at least `model.path` and `data.train`")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe is a YAML mapping of sections, got a {type(data).__name__}")
    return data


class _DictSource(PydanticBaseSettingsSource):
    """A fixed dict (the YAML file) as a pydantic-settings source, below the environment."""

    def __init__(self, settings_cls: type, data: dict[str, Any]):
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ is used instead
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._data


def build_recipe(data: dict[str, Any], overrides: dict[str, Any], origin: str) -> Recipe:
    """Validate: YAML data < HFLOW_ environment < overrides. `origin` names the file in errors."""

    class _Loaded(Recipe):
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                       file_secret_settings):
            return (init_settings, env_settings, _DictSource(settings_cls, data))

    try:
        loaded = _Loaded(**overrides)
    except ValidationError as err:
        raise UserError(_explain(err, origin, data, overrides)) from None
    return Recipe.model_validate(loaded.model_dump())


def load_recipe(spec: str, overrides: Iterable[str] = ()) -> tuple[Recipe, Path]:
    """The recipe at `spec` (a path or shipped name) with overrides applied, and its path."""
    path = resolve_recipe_path(spec)
    data = read_yaml(path)
    recipe = build_recipe(data, parse_overrides(overrides), str(path))
    locate_code(recipe, [path.parent, Path.cwd()])
    beside_recipe(recipe, path.parent)
    if recipe.name is None:
        problem = run_name_problem(path.stem)
        if problem:
            raise UserError(f"{path}: the run is named after the file, {path.stem!r}, but {problem}; set `name:` "
                            "in the recipe")
        recipe.name = path.stem
    return recipe, path


# The recipe keys that name code as module:attr (`engine/user_code.py`).
CODE_KEYS = ("reward.function", "cost.function", "rollout.env")


def locate_code(recipe: Recipe, folders: list[Path]) -> None:
    """Each of CODE_KEYS naming a module (one name, no dots) or a relative `file.py` found in one
    of `folders` (the recipe's, then the current one) is rewritten to that file's absolute path,
    `/abs/module.py:attr`, so that every worker imports the same file whatever its import path
    and folder. Built-ins, dotted and installed modules, and absolute paths stay as they are."""
    for key in CODE_KEYS:
        section, name = key.split(".")
        part = getattr(recipe, section)
        spec = getattr(part, name)
        module, sep, attr = (spec or "").rpartition(":")
        if not sep or not module or Path(module).is_absolute() or spec.startswith(REGISTERED_PREFIX):
            continue
        if not module.endswith(".py") and ("." in module or "/" in module):
            continue
        file = Path(module if module.endswith(".py") else module + ".py")
        found = next((folder / file for folder in folders if (folder / file).is_file()), None)
        if found is not None:
            setattr(part, name, f"{os.path.abspath(found)}:{attr}")


def beside_recipe(recipe: Recipe, folder: Path) -> None:
    """Each relative path of PATH_KEYS (but the output folder) that names something in the recipe's
    `folder` and nothing in the current one made absolute there: a recipe's own files are found
    from any folder (`hflow train proj/my.yaml` reads proj/train.jsonl). What exists in the current
    folder keeps its meaning, so shipped recipes and recipes run from their own folder read the
    same files as before."""
    for key, part, name in _path_slots(recipe):
        value = getattr(part, name)
        if not value or key == "trainer.output_dir" or value.startswith("synthetic:") or Path(value).is_absolute():
            continue
        if (folder / value).exists() and not Path(value).exists():
            setattr(part, name, os.path.abspath(folder / value))


# The recipe keys that may name a local file or folder. A run directory keeps them absolute, so that
# `--resume` from another folder reads the same files, not whatever sits at the relative path there.
PATH_KEYS = ("model.path", "reference.path", "critic.path", "reward.model", "cost.model", "cost.critic_path",
             "data.train", "data.eval", "ppo.ptx_data", "trainer.output_dir")


def _path_slots(recipe: Recipe):
    """(key, section object, field name) of every path a recipe may hold: PATH_KEYS, then each
    `eval.sets` entry's `data` (its key: eval.sets.data)."""
    for key in PATH_KEYS:
        section, name = key.split(".")
        yield key, getattr(recipe, section), name
    for held_out in recipe.eval.sets:
        yield "eval.sets.data", held_out, "data"


def absolute_paths(recipe: Recipe, base: Path | None = None) -> Recipe:
    """A copy of `recipe` with each of PATH_KEYS that names something under `base` (default: the
    current folder) made absolute: what exists there, the output folder, and `model.path` that
    `model.init` builds. A hub id (nothing at that path here), a `synthetic:` task and an absolute
    path stay as they are. Links are kept, not resolved (os.path.abspath)."""
    base = Path.cwd() if base is None else base
    resolved = recipe.model_copy(deep=True)
    for key, part, name in _path_slots(resolved):
        value = getattr(part, name)
        if not value or value.startswith("synthetic:") or Path(value).is_absolute():
            continue
        local = base / value
        if local.exists() or key == "trainer.output_dir" or (key == "model.path" and recipe.model.init):
            setattr(part, name, os.path.abspath(local))
    return resolved


def dump_recipe(recipe: Recipe) -> str:
    """The fully resolved recipe as YAML (what a run directory keeps)."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def _lookup(data: Any, loc: tuple) -> tuple[bool, Any]:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        else:
            return False, None
    return True, data


def _schema_keys(loc: tuple) -> list[str]:
    """The keys accepted in the section at `loc` (for did-you-mean hints)."""
    model: Any = Recipe
    for part in loc:
        field = model.model_fields.get(part) if isinstance(model, type) else None
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _explain(err: ValidationError, origin: str, data: dict, overrides: dict) -> str:
    """Every problem pydantic found, in one line (the first one first)."""
    algorithm = str(overrides.get("algorithm") or data.get("algorithm") or "grpo")
    problems = [_problem(e, origin, overrides, algorithm) for e in err.errors()]
    if len(problems) == 1:
        return problems[0]
    rest = "; ".join(p.removeprefix(f"{origin}: ").removeprefix(f"{origin} ") for p in problems[1:])
    return f"{problems[0]}; and {len(problems) - 1} more: {rest}"


def _problem(first: dict, origin: str, overrides: dict, algorithm: str) -> str:
    loc = tuple(str(p) for p in first["loc"])
    key = ".".join(loc) or "(recipe)"
    in_set = bool(loc) and _lookup(overrides, loc)[0]
    where = f"{origin} (--set {key})" if in_set else origin
    env_name = "HFLOW_" + "__".join(p.upper() for p in loc)
    if not in_set and env_name in os.environ:
        where = f"{origin} (environment {env_name})"
    kind = first["type"]
    if kind == "extra_forbidden":
        accepted = _schema_keys(loc[:-1])
        close = difflib.get_close_matches(loc[-1], accepted, n=1)
        hint = other_name_hint(loc[-1], algorithm, accepted) or (f"did you mean '{close[0]}'?" if close else "")
        return f"{where}: unknown key '{key}'; {hint + '; ' if hint else ''}accepted here: {', '.join(accepted)}"
    if kind == "missing":
        return f"{where}: missing required key '{key}'"
    if kind == "value_error" and not loc:
        return f"{where}: {first['msg'].removeprefix('Value error, ')}"
    value = first.get("input")
    if kind in ("model_type", "dict_type") and loc and not isinstance(value, dict):
        inner = _schema_keys(loc)
        example = f"; did you mean '{key}.{inner[0]}: {value}'?" if inner else ""
        return f"{where}: '{key}' is a section of keys ({', '.join(inner)}), not a value{example}"
    return f"{where}: key '{key}' has bad value {value!r}: {first['msg']}"