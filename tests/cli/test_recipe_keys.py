"""`hflow recipes keys [SECTION]` (issue #32): every recipe key with its type, default, readers and
description, read from the schema, so the list cannot fall behind it."""

from typer.testing import CliRunner

from hflow.cli.app import app
from hflow.trainer.config.recipe import Recipe


def _keys(*args):
    result = CliRunner().invoke(app, ["recipes", "keys", *args])
    return result, [line for line in result.stdout.splitlines() if not line.startswith("    ")]


def test_every_key_of_the_schema_is_listed_once():
    result, lines = _keys()
    assert result.exit_code == 0, result.output
    listed = [line.split(":")[0] for line in lines]
    assert len(listed) == len(set(listed))
    for name, field in Recipe.model_fields.items():
        section = getattr(field.annotation, "model_fields", None)
        for key in ([f"{name}.{k}" for k in section] if section else [name]):
            assert key in listed, key


def test_a_section_with_types_defaults_and_readers():
    result, lines = _keys("grpo")
    assert result.exit_code == 0 and all(line.startswith("grpo.") for line in lines)
    assert "grpo.policy_loss: 'ppo' | 'gspo' | 'cispo' = 'ppo'  [grpo]" in lines
    assert "cispo (REINFORCE on every token" in result.stdout  # the description, indented below
    _, critic = _keys("critic")
    assert all(line.endswith("[ppo, safe_rlhf]") for line in critic)
    _, model = _keys("model")
    assert "model.path: str = required  [all]" in model


def test_an_unknown_section_is_one_line():
    from helpers import assert_one_line_error, run_hflow

    assert_one_line_error(run_hflow("recipes", "keys", "rollouts"), "'rollouts'", "no such section",
                          "accepted: name, algorithm")
