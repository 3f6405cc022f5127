"""A run directory is checked before a resume or an evaluation uses it, never trusted because hflow
wrote it: its recipe is fully resolved and unedited, none of its files is a link written through,
a finished run says so, and a damaged checkpoint is one line for `hflow eval`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from helpers import assert_one_line_error, read_events, run_hflow


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model):
    """A finished 2-step run, trained in folder `a` from a recipe with relative paths (shared by copying)."""
    here = tmp_path_factory.mktemp("a")
    shutil.copytree(tiny_model, here / "models" / "tiny")
    (here / "r.yaml").write_text(yaml.safe_dump({
        "name": "t", "algorithm": "grpo", "model": {"path": "models/tiny", "init": "tiny"},
        "data": {"train": "synthetic:digits", "synthetic_size": 64}, "rollout": {"n": 2, "max_response_length": 4},
        "actor": {"lr": 0.002, "micro_batch_size": 8},
        "trainer": {"total_steps": 2, "prompts_per_step": 4, "save_every": 1, "output_dir": "runs"},
        "logging": {"progress": "lines"},
    }))
    result = run_hflow("train", "r.yaml", cwd=here)
    assert result.returncode == 0, result.stderr[-3000:]
    return here, here / result.stdout.strip().splitlines()[-1]


def copy_of(finished, tmp_path: Path) -> Path:
    run = tmp_path / finished[1].name
    shutil.copytree(finished[1], run)
    return run


@pytest.mark.slow
def test_resume_from_another_folder_reads_the_runs_own_files(finished, tmp_path):
    here, original = finished
    recipe = yaml.safe_load((original / "recipe.yaml").read_text())
    assert recipe["model"]["path"] == str(here / "models" / "tiny")
    assert recipe["trainer"]["output_dir"] == str(here / "runs")
    assert recipe["data"]["train"] == "synthetic:digits"
    run = copy_of(finished, tmp_path)
    elsewhere = tmp_path / "b"
    elsewhere.mkdir()
    result = run_hflow("train", "--resume", str(run), "--set", "trainer.total_steps=3", cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [e["step"] for e in read_events(run)] == [1, 2, 3]
    assert list(elsewhere.iterdir()) == []  # no model built (or read) at models/tiny here


@pytest.mark.slow
def test_an_edited_recipe_is_refused_on_resume(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    saved = run / "recipe.yaml"
    saved.write_text(saved.read_text().replace("lr: 0.002", "lr: 0.5"))
    result = run_hflow("train", "--resume", str(run), "--set", "trainer.total_steps=3")
    assert_one_line_error(result, f"{saved} was edited", "undo the edit", "start a new run")
    assert [e["step"] for e in read_events(run)] == [1, 2]


@pytest.mark.slow
def test_a_finished_run_says_so_and_narrowing_trust_is_allowed(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in (run / "final").iterdir()}
    result = run_hflow("train", "--resume", str(run), "--set", "model.trust_remote_code=false")
    assert result.returncode == 0, result.stderr[-3000:]
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {run} finished all 2 steps already, nothing to do (to train further: hflow train "
                     f"--resume {run} --set trainer.total_steps=N, N > 2)"]
    assert result.stdout.strip().splitlines()[-1] == str(run)
    assert {p: p.stat().st_mtime_ns for p in (run / "final").iterdir()} == before  # nothing redone
    assert json.loads((run / "status.json").read_text())["status"] == "finished"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["run.lock", "train.log", "status.json.tmp", "events.jsonl.tmp"])
def test_a_link_in_a_run_directory_is_refused_and_its_target_kept(finished, tmp_path, name):
    run = copy_of(finished, tmp_path)
    victim = tmp_path / "precious.txt"
    victim.write_text("mine")
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(victim)
    result = run_hflow("train", "--resume", str(run), "--set", "trainer.total_steps=3")
    assert_one_line_error(result, f"{run / name} is a symbolic link")
    assert victim.read_text() == "mine"


@pytest.mark.slow
def test_a_run_lock_that_is_a_folder_is_one_line(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    (run / "run.lock").unlink()
    (run / "run.lock").mkdir()
    result = run_hflow("train", "--resume", str(run))
    assert_one_line_error(result, f"{run / 'run.lock'} is a folder")


def damage(checkpoint: Path, how: str) -> None:
    weights = checkpoint / "actor" / "weights.safetensors"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif how == "random":
        weights.write_bytes(bytes(range(256)) * (weights.stat().st_size // 256 + 1))
    elif how == "missing":
        weights.unlink()
    else:
        (checkpoint / "COMPLETE").unlink()


@pytest.mark.slow
@pytest.mark.parametrize("how, problem", [
    ("truncated", "the checkpoint is damaged: actor/weights.safetensors is truncated"),
    ("random", "the checkpoint is damaged: actor/weights.safetensors is "),
    ("missing", "the checkpoint is damaged: actor/weights.safetensors is missing"),
    ("unfinished", "no COMPLETE marker, so the checkpoint was never finished"),
])
def test_eval_of_a_damaged_checkpoint_is_one_line(finished, tmp_path, how, problem):
    checkpoint = tmp_path / "step_000002"
    shutil.copytree(finished[1] / "checkpoints" / "step_000002", checkpoint)
    damage(checkpoint, how)
    result = run_hflow("eval", str(finished[1] / "recipe.yaml"), "--checkpoint", str(checkpoint),
                       "--set", "data.eval=synthetic:digits", "--set", "data.eval_size=4")
    assert_one_line_error(result, f"--checkpoint {checkpoint}: {problem}", "evaluate an earlier checkpoint")


def test_a_run_name_outside_the_output_folder_is_one_line(tmp_path, tiny_model):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "../../escaped", "model": {"path": str(tiny_model)},
                                      "data": {"train": "synthetic:digits"},
                                      "trainer": {"output_dir": str(tmp_path / "out" / "runs")}}))
    result = run_hflow("train", str(recipe), cwd=tmp_path)
    assert_one_line_error(result, str(recipe), "key 'name' has bad value '../../escaped'", "one folder name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]
