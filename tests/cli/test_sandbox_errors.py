"""`tools.sandbox` at start-up: a recipe whose environment runs model-written code stops in one
line (exit 2) when its sandbox cannot run here, naming the fix; opting out is a warning; the
http sandbox's keys are checked with the recipe."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from helpers import assert_one_line_error, assert_recipe_error, run_hflow

from hflow.errors import UserError
from hflow.trainer.config.load import load_recipe
from hflow.trainer.control.inputs import check_inputs

TESTS = Path(__file__).resolve().parents[1]
CODE_ENV = "rollout.env=code_envs:PythonEnv"


@pytest.mark.parametrize("overrides, needles", [
    (["tools.sandbox=http"], ["tools.sandbox http", "set tools.sandbox_url"]),
    (["tools.sandbox_url=http://sandbox:8080"], ["tools.sandbox_url 'http://sandbox:8080'", "(it is bwrap)"]),
    (["tools.sandbox=http", "tools.sandbox_url=sandbox:8080"], ["tools.sandbox_url 'sandbox:8080'", "http://"]),
    (["tools.sandbox=docker"], ["tools.sandbox", "'bwrap', 'http' or 'none'"]),
])
def test_sandbox_key_mistakes_are_one_line(overrides, needles):
    assert_recipe_error("grpo/tiny_calculator", overrides, needles)


def test_the_default_is_bwrap_and_reaches_the_actor():
    from hflow.trainer.placement.worker_specs import actor_spec

    recipe, _ = load_recipe("grpo/tiny_calculator")
    assert (recipe.tools.sandbox, recipe.tools.sandbox_url) == ("bwrap", None)
    recipe, _ = load_recipe("grpo/tiny_calculator", ["tools.sandbox=http", "tools.sandbox_url=http://sb:8080"])
    spec = actor_spec(recipe).rollout
    assert (spec.sandbox, spec.sandbox_url) == ("http", "http://sb:8080")


def _check(monkeypatch, tmp_path, *overrides: str) -> None:
    monkeypatch.chdir(tmp_path)  # the recipe's tiny model is built by `hflow train`: not checked here
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    recipe, _ = load_recipe("grpo/tiny_calculator", list(overrides))
    check_inputs(recipe)


def test_without_bwrap_a_code_environment_stops_before_training(monkeypatch, tmp_path):
    with pytest.raises(UserError) as err:
        _check(monkeypatch, tmp_path, CODE_ENV)
    line = str(err.value)
    assert line.startswith("tools.sandbox bwrap: model-written code runs only in a sandbox, and bubblewrap "
                           "(bwrap) is not installed; install bubblewrap (Debian/Ubuntu: apt-get install "
                           "bubblewrap") and "\n" not in line, line
    _check(monkeypatch, tmp_path)  # the calculator runs no model-written code: no sandbox needed
    _check(monkeypatch, tmp_path, CODE_ENV, "tools.sandbox=http", "tools.sandbox_url=http://sb:8080")


def test_opting_out_is_a_warning(monkeypatch, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hflow.sandbox"):
        _check(monkeypatch, tmp_path, CODE_ENV, "tools.sandbox=none")
    assert "model-written code runs WITHOUT a sandbox" in caplog.text and "code_envs:PythonEnv" in caplog.text


def test_hflow_validate_without_bwrap_is_one_line(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    result = run_hflow("validate", "grpo/tiny_calculator", "--set", CODE_ENV, cwd=tmp_path, env=env, timeout=300)
    assert_one_line_error(result, "tools.sandbox bwrap", "install bubblewrap", "tools.sandbox: none")
