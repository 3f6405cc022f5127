"""What `trainer.mode: async` does not run: one line naming the keys, exit 2."""

import pytest
import torch
from helpers import assert_one_line_error, assert_recipe_error, run_hflow

from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe, load_recipe


def test_async_with_ppo_is_a_one_line_error_through_the_cli(tmp_path):
    result = run_hflow("validate", "ppo/tiny", "--set", "trainer.mode=async", cwd=tmp_path)
    assert_one_line_error(result, "ppo/tiny.yaml", "trainer.mode async does not run algorithm ppo", "critic",
                          "grpo, rloo, reinforce_pp, reinforce_pp_baseline, gspo")


@pytest.mark.parametrize("recipe, overrides, needles", [
    ("remax/tiny", ["trainer.mode=async"], ["algorithm remax", "greedy baseline"]),
    ("safe_rlhf/tiny", ["trainer.mode=async"], ["algorithm safe_rlhf", "Lagrange"]),
    ("dapo/tiny", ["trainer.mode=async"], ["algorithm dapo", "dynamic sampling"]),
    ("grpo/quickstart", ["trainer.mode=async", "rollout.engine=vllm", "actor.recompute_old_log_probs=true",
                         "placement.backend=local"], ["trainer.mode async", "vllm", "placement.backend: ray"]),
    ("grpo/quickstart", ["trainer.mode=async", "rollout.engine=vllm", "actor.recompute_old_log_probs=true",
                         "placement.backend=ray", "placement.mode=split", "rollout.tensor_parallel_size=2"],
     ["trainer.mode async", "tensor_parallel_size 1"]),
    ("grpo/quickstart", ["actor.off_policy_correction=tis", "actor.recompute_old_log_probs=false"],
     ["actor.off_policy_correction=tis", "actor.recompute_old_log_probs: true"]),
    ("grpo/quickstart", ["trainer.max_staleness=-1"], ["trainer.max_staleness"]),
    ("grpo/tiny_calculator", ["trainer.mode=async"], ["trainer.mode async", "single-turn", "rollout.env"]),
])
def test_what_async_mode_does_not_run_is_a_user_error(recipe, overrides, needles):
    assert_recipe_error(recipe, overrides, needles)


def test_async_on_ray_with_the_rollout_role_sharing_a_pool_is_one_line_before_ray_starts(tmp_path):
    result = run_hflow("train", "grpo/tiny_async", "--output-dir", str(tmp_path / "runs"),
                       "--set", "placement.backend=ray", "--set", "placement.mode=colocate",
                       "--set", "cluster.cpu_slots=2", cwd=tmp_path)
    assert_one_line_error(result, "tiny_async.yaml", "trainer.mode async on the ray backend generates on a pool of "
                          "its own", "placement.mode colocate", "placement.mode split or standalone")
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_async_on_ray_with_the_rollout_role_mapped_onto_a_training_pool_is_one_line(tiny_model):
    from hflow.trainer.placement.worker_groups import build_worker_groups

    recipe = build_recipe({
        "name": "t", "algorithm": "grpo", "model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits"},
        "trainer": {"mode": "async"}, "cluster": {"cpu_slots": 2},
        "placement": {"backend": "ray", "mode": "explicit", "pools": {"a": 1, "b": 1},
                      "roles": {"actor": "a", "reward": "b", "reference": "b", "rollout": "b"}}}, {}, "t.yaml")
    with pytest.raises(UserError, match="puts the rollout role on pool 'b' with reward, reference; use placement"):
        build_worker_groups(recipe, ["actor", "reward", "reference"], torch.device("cpu"))


@pytest.mark.parametrize("recipe", ["grpo/quickstart", "gspo/tiny", "rloo/tiny", "reinforce_pp/tiny",
                                    "reinforce_pp/tiny_baseline"])
def test_the_outcome_algorithms_accept_async_mode(recipe):
    loaded, _ = load_recipe(recipe, ["trainer.mode=async", "trainer.max_staleness=2",
                                     "actor.off_policy_correction=decoupled"])
    assert loaded.trainer.mode == "async" and loaded.trainer.max_staleness == 2


def test_every_algorithm_is_either_run_asynchronously_or_refused_with_a_reason():
    from pydantic import ValidationError

    from hflow.trainer.config.algorithm_sections import ALGORITHMS
    from hflow.trainer.config.recipe import ASYNC_ALGORITHMS, Recipe

    assert set(ASYNC_ALGORITHMS) == {"grpo", "gspo", "rloo", "reinforce_pp", "reinforce_pp_baseline"}
    for name, spec in ALGORITHMS.items():
        keys = dict(model={"path": "m"}, data={"train": "synthetic:digits"}, algorithm=name,
                    cost={"function": "synthetic_cost"}, trainer={"mode": "async"})
        if name in ASYNC_ALGORITHMS:
            assert spec.no_async is None and Recipe(**keys).trainer.mode == "async"
            continue
        with pytest.raises(ValidationError, match=f"does not run algorithm {name}: {spec.no_async}"):
            Recipe(**keys)
