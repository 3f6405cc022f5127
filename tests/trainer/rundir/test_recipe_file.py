"""A run directory keeps its recipe fully resolved (every local path absolute) with its hash, and a
resume refuses a recipe.yaml edited since the run began."""

from __future__ import annotations

import json
import os

import pytest

from hflow.errors import UserError
from hflow.trainer.config.load import absolute_paths, build_recipe, read_yaml
from hflow.trainer.rundir.recipe_file import check_unedited
from hflow.trainer.rundir.writer import RunDir


def test_local_paths_become_absolute_and_the_rest_stays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for folder in ("models/tiny", "models/rm"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "prompts.jsonl").write_text("")
    recipe = build_recipe({
        "model": {"path": "models/tiny"}, "reference": {"path": "Qwen/Qwen2.5-0.5B"},  # a hub id: nothing here
        "reward": {"model": "models/rm"}, "critic": {"path": "./models/../models/rm"},
        "data": {"train": "prompts.jsonl", "eval": "synthetic:digits"}, "trainer": {"output_dir": "runs"},
    }, {}, "r.yaml")
    resolved = absolute_paths(recipe)
    assert resolved.model.path == str(tmp_path / "models/tiny")
    assert resolved.reward.model == resolved.critic.path == str(tmp_path / "models/rm")
    assert resolved.data.train == str(tmp_path / "prompts.jsonl")
    assert resolved.trainer.output_dir == str(tmp_path / "runs")  # not there yet: the run creates it
    assert resolved.reference.path == "Qwen/Qwen2.5-0.5B" and resolved.data.eval == "synthetic:digits"
    assert recipe.model.path == "models/tiny"  # a copy: the recipe given is left as it was
    built = absolute_paths(build_recipe({"model": {"path": "new/tiny", "init": "tiny"},
                                         "data": {"train": "synthetic:digits"}}, {}, "r.yaml"))
    assert built.model.path == os.path.join(tmp_path, "new/tiny")  # model.init builds it there


@pytest.fixture
def run(tmp_path):
    recipe = build_recipe({"name": "hashed", "model": {"path": str(tmp_path / "m")},
                           "data": {"train": "synthetic:digits"}}, {}, "test")
    created = RunDir.create(recipe, str(tmp_path / "runs"))
    created.close()
    return created.path


def test_a_comment_is_no_edit_and_a_changed_value_is_refused(run):
    saved = run / "recipe.yaml"
    digest = (run / "recipe.sha256").read_text().strip()
    saved.write_text("# a note\n" + saved.read_text())
    assert check_unedited(run, read_yaml(saved)) == digest
    saved.write_text(saved.read_text().replace("lr: 1.0e-06", "lr: 0.01"))
    with pytest.raises(UserError) as refused:
        check_unedited(run, read_yaml(saved))
    assert str(refused.value) == (
        f"--resume {run}: {saved} was edited after the run started (its hash is not the one in recipe.sha256); a "
        "resume continues the run as it was: undo the edit, or start a new run with the edited recipe (hflow train "
        f"{saved}); what may change on resume goes in --set")


def test_the_checkpoints_hash_still_refuses_an_edit_when_recipe_sha256_was_edited_too(run):
    from hflow.trainer.rundir.recipe_file import recipe_digest

    saved = run / "recipe.yaml"
    checkpoint = run / "checkpoints" / "step_000002"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps(
        {"step": 2, "recipe_sha256": (run / "recipe.sha256").read_text().strip()}))
    saved.write_text(saved.read_text().replace("temperature: 1.0", "temperature: 0.7"))
    (run / "recipe.sha256").write_text(recipe_digest(read_yaml(saved)))
    with pytest.raises(UserError, match="its hash is not the one in checkpoints/step_000002/trainer_state.json"):
        check_unedited(run, read_yaml(saved))


def test_a_run_written_before_hashes_resumes_unchecked(run):
    (run / "recipe.sha256").unlink()
    assert check_unedited(run, read_yaml(run / "recipe.yaml"))
