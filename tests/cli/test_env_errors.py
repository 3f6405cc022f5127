"""`rollout.env` mistakes end `hflow validate` (and `hflow train`, which runs the same checks)
before any worker starts: one line naming the key and
the value, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import assert_one_line_error, run_hflow, write_recipe

ENV = {"reward": {"function": "env"}}
TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("spec, needle", [
    ("no_such_module_xyz:Env", "cannot import module 'no_such_module_xyz'"),
    ("hflow.recipes.envs.calculator:NoSuchEnv", "has no class 'NoSuchEnv'"),
    ("hflow.engine.rollout.tools:ToolCall", "has no reset or step method"),
])
def test_a_bad_env_import_path_is_one_line(tmp_path, tiny_model, spec, needle):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, rollout={"env": spec}, **ENV)
    assert_one_line_error(run_hflow("validate", str(recipe), timeout=120), f"rollout.env {spec!r}", needle)


def test_env_with_vllm_tensor_parallel_and_env_reward_without_env_are_one_line(tmp_path, tiny_model):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, actor={"recompute_old_log_probs": True},
                          rollout={"env": "hflow.recipes.envs.calculator:CalculatorEnv", "engine": "vllm",
                                   "tensor_parallel_size": 2}, **ENV)
    assert_one_line_error(run_hflow("validate", str(recipe), timeout=120), "rollout.env",
                          "rollout.tensor_parallel_size: 1")
    recipe = write_recipe(tmp_path / "r2.yaml", tiny_model, **ENV)
    assert_one_line_error(run_hflow("validate", str(recipe), timeout=120), "reward.function env", "rollout.env")


def test_an_environment_that_raises_during_a_run_is_one_line(tmp_path, tiny_model):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, rollout={"env": "faulty_envs:StepRaises", "n": 2},
                          actor={"micro_batch_size": 4, "mini_batch_size": 4},
                          trainer={"total_steps": 2, "prompts_per_step": 2}, **ENV)
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    result = run_hflow("train", str(recipe), env=env, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: rollout.env 'faulty_envs:StepRaises': step() raised RuntimeError: the environment broke")
