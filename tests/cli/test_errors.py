"""Every user mistake: one line on stderr naming what is wrong, exit code 2, no traceback."""

import json

import pytest

from helpers import assert_one_line_error, run_hflow, write_recipe


@pytest.fixture
def recipe(tmp_path, tiny_model):
    return write_recipe(tmp_path / "r.yaml", tiny_model)


def test_unknown_key_suggests_the_right_one(tmp_path, tiny_model):
    path = write_recipe(tmp_path / "r.yaml", tiny_model, trainer={"totl_steps": 3})
    assert_one_line_error(run_hflow("train", str(path)), "r.yaml", "trainer.totl_steps", "total_steps")


def test_wrong_type(tmp_path, tiny_model):
    path = write_recipe(tmp_path / "r.yaml", tiny_model, actor={"lr": "fast"})
    assert_one_line_error(run_hflow("validate", str(path)), "r.yaml", "actor.lr", "'fast'")


def test_bad_set_override(recipe):
    assert_one_line_error(run_hflow("train", str(recipe), "--set", "rollout.n=many"),
                          "--set rollout.n", "'many'")
    assert_one_line_error(run_hflow("train", str(recipe), "--set", "novalue"), "KEY=VALUE")


def test_bad_environment_override(recipe):
    result = run_hflow("validate", str(recipe), env={"HFLOW_TRAINER__TOTAL_STEPS": "-3"})
    assert_one_line_error(result, "HFLOW_TRAINER__TOTAL_STEPS", "trainer.total_steps")


def test_missing_recipe_file(tmp_path):
    assert_one_line_error(run_hflow("train", str(tmp_path / "nope.yaml")), "nope.yaml", "no such recipe")


def test_invalid_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model: [unclosed\n")
    assert_one_line_error(run_hflow("validate", str(path)), "broken.yaml", "not valid YAML")


def test_model_path_that_does_not_exist(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", tmp_path / "no-model")
    assert_one_line_error(run_hflow("train", str(path)), "no-model", "does not exist")


def test_empty_dataset(tmp_path, tiny_model):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    path = write_recipe(tmp_path / "r.yaml", tiny_model, data={"train": str(data)})
    assert_one_line_error(run_hflow("train", str(path)), "empty.jsonl", "empty")


def test_missing_data_file_and_column(tmp_path, tiny_model):
    path = write_recipe(tmp_path / "r.yaml", tiny_model, data={"train": str(tmp_path / "none.jsonl")})
    assert_one_line_error(run_hflow("train", str(path)), "none.jsonl", "does not exist")
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "hi"}) + "\n")
    path = write_recipe(tmp_path / "r2.yaml", tiny_model, data={"train": str(data)})
    assert_one_line_error(run_hflow("train", str(path)), "no column 'prompt'", "question")


def test_bad_batch_arithmetic(tmp_path, tiny_model):
    path = write_recipe(tmp_path / "r.yaml", tiny_model, actor={"mini_batch_size": 24})
    assert_one_line_error(run_hflow("validate", str(path)), "mini_batch_size=24", "32")


def test_resume_of_something_that_is_not_a_run(tmp_path):
    assert_one_line_error(run_hflow("train", "--resume", str(tmp_path)), "not a run directory")


def test_algorithm_input_mistakes(tmp_path, tiny_model):
    no_cost = write_recipe(tmp_path / "safe.yaml", tiny_model, algorithm="safe_rlhf")
    assert_one_line_error(run_hflow("validate", str(no_cost)), "safe.yaml", "cost.model", "cost.function")
    bad_fn = write_recipe(tmp_path / "cost.yaml", tiny_model, algorithm="safe_rlhf", cost={"function": "nope"})
    assert_one_line_error(run_hflow("validate", str(bad_fn)), "cost.yaml", "cost.function", "'nope'",
                          "synthetic_cost")
    critic = write_recipe(tmp_path / "ppo.yaml", tiny_model, algorithm="ppo", critic={"mini_batch_size": 5})
    assert_one_line_error(run_hflow("validate", str(critic)), "critic.mini_batch_size=5")
    assert_one_line_error(run_hflow("init-model", "tiny-reward", str(tmp_path / "rm"), "--task", "poems"),
                          "--task 'poems'", "digits")


def test_a_gpu_cuda_cannot_use_stops_auto_instead_of_falling_back_to_the_cpu(recipe, tmp_path):
    """`trainer.device: auto` on a machine with an NVIDIA GPU (here: `nvidia-smi` on the PATH)
    that this torch cannot use (here: a CPU-only build) says so, in one line."""
    import os
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA works here: auto is the GPU")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    result = run_hflow("train", str(recipe), "--set", "trainer.device=auto", env={"PATH": path})
    assert_one_line_error(result, "NVIDIA GPU, but CUDA cannot use it", f"torch {torch.__version__}",
                          "trainer.device: cpu")
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_bfloat16_on_a_gpu_without_it_stops_before_a_run_directory(monkeypatch, tmp_path, tiny_model):
    """model.dtype bfloat16 on a pre-Ampere GPU (stood in for: CUDA and its answers mocked)."""
    import torch
    from typer.testing import CliRunner

    from hflow.cli.app import app
    from hflow.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    path = write_recipe(tmp_path / "r.yaml", tiny_model)
    result = CliRunner().invoke(app, ["train", str(path), "--set", "model.dtype=bfloat16"])
    assert isinstance(result.exception, UserError), result.output  # `hflow` prints it in one line, exit 2
    for needle in ("model.dtype is bfloat16", "Tesla V100-SXM2-32GB", "compute capability 7.0"):
        assert needle in str(result.exception)
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made
