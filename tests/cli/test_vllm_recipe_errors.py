"""`rollout.engine: vllm` where it cannot run, and impossible combinations: one line on stderr
naming the key and the fix, exit code 2, before any run directory exists."""

import importlib.util
import types

import pytest

from helpers import assert_one_line_error, run_hflow, write_recipe
from hflow.errors import UserError
from hflow.trainer.recipe_load import build_recipe

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None


@pytest.fixture
def recipe(tmp_path, tiny_model):
    return write_recipe(tmp_path / "r.yaml", tiny_model)


@pytest.mark.skipif(VLLM_INSTALLED, reason="vLLM is installed here")
def test_validate_and_train_without_vllm(recipe, tmp_path):
    needles = ("r.yaml", "rollout.engine", "vLLM is not installed", "pip install 'hflow[vllm]'", "rollout.engine: hf")
    assert_one_line_error(run_hflow("validate", str(recipe), "--set", "rollout.engine=vllm"), *needles)
    assert_one_line_error(run_hflow("train", str(recipe), "--set", "rollout.engine=vllm"), *needles)
    assert not (tmp_path / "runs").exists()  # failed before a run directory was made


def test_vllm_importable_but_no_gpu(recipe, tmp_path):
    fake = tmp_path / "fake-site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('hflow must not import vLLM to check for it')\n")
    env = {"PYTHONPATH": str(fake.parent), "CUDA_VISIBLE_DEVICES": ""}
    result = run_hflow("validate", str(recipe), "--set", "rollout.engine=vllm", env=env)
    assert_one_line_error(result, "r.yaml", "rollout.engine", "no CUDA GPU is visible", "pip install 'hflow[vllm]'")


@pytest.mark.parametrize("overrides, needles", [
    (["rollout.engine=vllm", "actor.recompute_old_log_probs=false"],
     ("rollout.engine vllm", "actor.recompute_old_log_probs: true", "entropy")),
    (["rollout.tensor_parallel_size=2"], ("rollout.tensor_parallel_size=2", "rollout.engine: vllm")),
    (["rollout.engine=vllm", "trainer.device=cpu"], ("rollout.engine vllm", "trainer.device is 'cpu'")),
    (["rollout.engine=sglang"], ("rollout.engine", "'sglang'", "'hf' or 'vllm'")),
])
def test_impossible_combinations(recipe, overrides, needles):
    args = [a for o in overrides for a in ("--set", o)]
    assert_one_line_error(run_hflow("validate", str(recipe), *args), "r.yaml", *needles)


def test_tensor_parallel_size_must_divide_the_actor_ranks(tiny_model):
    from hflow.trainer.session import _check_divisible

    recipe = build_recipe({"model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits"},
                           "rollout": {"engine": "vllm", "tensor_parallel_size": 2},
                           "trainer": {"prompts_per_step": 12}}, {}, "r.yaml")
    groups = types.SimpleNamespace(items=lambda: [("actor", types.SimpleNamespace(world_size=3))])
    with pytest.raises(UserError, match=r"rollout.tensor_parallel_size=2 does not divide the 3 ranks"):
        _check_divisible(recipe, groups)
    groups = types.SimpleNamespace(items=lambda: [("actor", types.SimpleNamespace(world_size=4))])
    _check_divisible(recipe, groups)


def test_expandable_segments_conflict_with_sleep_mode(tiny_model, monkeypatch):
    import hflow.engine.vllm_engine as vllm_engine
    from hflow.trainer.recipe_load import check_runtime

    recipe = build_recipe({"model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits"},
                           "rollout": {"engine": "vllm"}}, {}, "r.yaml")
    monkeypatch.setattr(vllm_engine, "unavailable_reason", lambda: None)  # as on a GPU machine with vLLM
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(UserError, match=r"r.yaml: rollout.engine is 'vllm' but PYTORCH_CUDA_ALLOC_CONF"):
        check_runtime(recipe, "r.yaml")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    check_runtime(recipe, "r.yaml")
