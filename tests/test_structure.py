"""Guards: every shipped recipe validates, every command's --help works, every module imports,
and every package folder is installed."""

import importlib
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hflow.cli.app import app
from hflow.errors import UserError
from hflow.trainer.config.load import load_recipe, shipped_recipes
from hflow.trainer.control.preflight import check_runtime

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = [p.parent for p in ROOT.rglob("__init__.py")
                if not {"tests", ".venv", "build"} & set(p.relative_to(ROOT).parts)]


MAPPER_ONLY = "auto-mapper example only"  # a recipe's header says so where hflow cannot train it


@pytest.mark.parametrize("name", shipped_recipes())
def test_shipped_recipe_validates(name, monkeypatch):
    """`hflow validate --no-inputs` (its models are hub ids or built later): the recipe loads and, where
    it names GPUs, fits their memory as hflow runs it; an auto-mapper example says so instead."""
    monkeypatch.setattr("hflow.trainer.placement.memory_check.visible_gpus", lambda: 0)  # not this machine's
    recipe, path = load_recipe(name)
    assert recipe.name and path.is_file()
    header = path.read_text().splitlines()[:12]
    if any(MAPPER_ONLY in line for line in header):
        assert any("hflow map" in line for line in header), f"{name}: header must show the command"
        with pytest.raises(UserError, match=f"{path}: .*{MAPPER_ONLY}"):
            check_runtime(recipe, str(path))
        return
    assert any("hflow train" in line for line in header), f"{name}: header must show the command"
    check_runtime(recipe, str(path))


def _commands(typer_app, prefix=()):
    group = typer_app if hasattr(typer_app, "registered_commands") else None
    for cmd in group.registered_commands:
        yield (*prefix, cmd.name or cmd.callback.__name__.replace("_", "-").rstrip("-"))
    for sub in group.registered_groups:
        yield (*prefix, sub.name)
        yield from _commands(sub.typer_instance, (*prefix, sub.name))


@pytest.mark.parametrize("command", [(), *_commands(app)], ids=lambda c: " ".join(c) or "hflow")
def test_help_works(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def _modules():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if {"tests", ".venv", "build", "benchmarks", "docker", "docs"} & set(rel.parts) or rel.name == "__main__.py":
            continue
        parts = ["hflow", *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_module_imports(module):
    importlib.import_module(module)


def test_every_package_is_installed():
    listed = set(re.findall(r'"(hflow[\w.]*)"', (ROOT / "pyproject.toml").read_text().split("packages = [")[1].split("]")[0]))
    expected = {".".join(["hflow", *d.relative_to(ROOT).parts]) for d in PACKAGE_DIRS}
    assert expected <= listed, f"add to pyproject packages: {sorted(expected - listed)}"
