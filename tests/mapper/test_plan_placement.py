"""`plan_placement`: the dict `hflow train` writes as plan.json for `placement: auto`."""

import json

import pytest

from hflow.errors import UserError
from hflow.mapper.plan import plan_placement
from hflow.trainer.config.load import build_recipe


def _recipe(**sections):
    data = {"model": {"path": "llama2-7b"}, "data": {"train": "data/prompts.jsonl"}, "placement": {"mode": "auto"}}
    data.update(sections)
    return build_recipe(data, {}, "test.yaml")


def test_plan_has_the_shape_of_an_explicit_placement(paper_recipe):
    plan = plan_placement(paper_recipe("llama2-13b"), 128)
    json.dumps(plan)  # JSON-able
    assert plan["backend"] == "ray"
    pools = {pool["name"]: pool for pool in plan["pools"]}
    assert sum(pool["devices"] for pool in pools.values()) <= 128
    for role, entry in plan["roles"].items():
        assert role in pools[entry["pool"]]["roles"]
        assert entry["strategy"] == plan["strategies"][role]
        assert entry["model"] == "meta-llama/Llama-2-13b-hf"
    assert sorted(plan["roles"]) == ["actor", "critic", "reference", "reward"]
    assert plan["estimated_iteration_s"] > 0 and plan["throughput_tokens_per_s"] > 0
    # Every pool's peak fits the device's usable memory.
    for pool in pools.values():
        mem = pool["memory_gb"]
        assert max(mem["generation"], mem["preparation"], mem["training"]) <= mem["usable"] < mem["capacity"]


def test_gpus_argument_overrides_the_recipe(paper_recipe):
    assert plan_placement(paper_recipe("llama2-7b"))["devices_total"] == 8  # cluster.gpus
    assert plan_placement(paper_recipe("llama2-7b"), 32)["devices_total"] == 32


def test_without_gpus_the_plan_covers_cpu_worker_slots(monkeypatch, tmp_path):
    monkeypatch.setattr("hflow.mapper.plan.os.cpu_count", lambda: 4)
    recipe = _recipe(model={"path": str(tmp_path / "tiny"), "init": "tiny"}, data={"train": "synthetic:add"})
    plan = plan_placement(recipe)
    assert plan["device"] == "cpu" and plan["devices_total"] == 4 and plan["parallel"] == "zero"
    assert sum(pool["devices"] for pool in plan["pools"]) <= 4
    assert plan_placement(recipe, 1)["backend"] == "local"  # one device: run in the controller


def test_gpu_auto_without_a_visible_gpu_plans_cpu_slots_and_says_so():
    plan = plan_placement(_recipe(model={"path": "tiny"}, cluster={"gpus": 2, "gpu": "auto"}))
    assert plan["device"] == "cpu" and plan["devices_total"] == 2 and "--gpu TYPE" in plan["note"]


def test_bad_counts_are_user_errors(paper_recipe):
    with pytest.raises(UserError, match="--gpus-per-node"):
        plan_placement(paper_recipe("llama2-7b"), 8, gpus_per_node=0)
    with pytest.raises(UserError, match="parallel"):
        plan_placement(paper_recipe("llama2-7b"), 8, parallel="4d")


def test_reward_function_is_not_a_model_role():
    plan = plan_placement(_recipe(algorithm="grpo", cluster={"gpus": 8, "gpu": "a100-80g"}))
    assert sorted(plan["roles"]) == ["actor", "reference"]
    plan = plan_placement(_recipe(algorithm="grpo", grpo={"kl_coef": 0}, cluster={"gpus": 8, "gpu": "a100-80g"}))
    assert list(plan["roles"]) == ["actor"]
