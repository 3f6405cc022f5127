"""Async mode's plans (mapper/async_plan.py): a rollout pool beside the training pools, a step costing
max(generation, training) + weight sync, and `hflow map` printing it."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hflow.mapper.latency as latency
from hflow.errors import UserError
from hflow.mapper.async_plan import search_async
from hflow.mapper.devices import resolve_device
from hflow.mapper.models import ModelShape
from hflow.mapper.plan import plan_placement
from hflow.mapper.strategy import Setting
from hflow.mapper.workload import Workload
from hflow.trainer.config.load import build_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

# params(lm_head=True): embedding 1000 x 1000 + one layer (q, o: 2 x 1000 x 1000; k, v with one KV head of
# 1000: 2 x 1000 x 1000; MLP 3 x 1000 x 1000; two norms 2 x 1000) + final norm 1000 + head 1000 x 1000
# = 1,000,000 + 7,002,000 + 1,000 + 1,000,000 = 9,003,000 weights, x 2 bytes (bf16) = 18,006,000 bytes.
TOY = ModelShape("toy", layers=1, hidden=1000, heads=1, kv_heads=1, ffn=1000, vocab=1000)
SYNC_BYTES = 18_006_000


def _toy_setting(per_node: int) -> Setting:
    """One actor (GRPO without a KL term); the weights cross NVLink in 1 s and the network in 2 s."""
    device = replace(resolve_device("a100-80g"), intra_bw=SYNC_BYTES / 1.0, inter_bw=SYNC_BYTES / 2.0)
    workload = Workload("grpo", {"actor": TOY}, prompts=8, n=1, prompt_len=8, response_len=8, micro_batch=8)
    return Setting(workload, device, per_node, parallel="zero")


@pytest.fixture
def linear_costs(monkeypatch):
    """linear_costs(gen, train): generation takes gen / engines s, training train / dp s; nothing else costs."""
    def use(gen: float, train: float) -> None:
        monkeypatch.setattr(latency, "generation_time", lambda *a, replicas, waves, **k: gen / replicas * waves)
        monkeypatch.setattr(latency, "train_time", lambda *a, dp, **k: train / dp)
    return use


def test_generation_dominated_step_is_max_plus_sync_by_hand(linear_costs):
    linear_costs(gen=12.0, train=4.0)
    # 4 devices on one node. Rollout r, training 4 - r: r=1: max(12, 4/3) + 1 = 13; r=2: max(6, 2) + 1 = 7;
    # r=3: max(4, 4) + 1 = 5, the best. Sync, colocated on 4: generation 12/4 + training 4/4 = 4.
    result = search_async(_toy_setting(per_node=4), 4)
    best = result.best
    assert (best.rollout.devices, best.training.devices) == (3, 1)
    assert best.generation_s == pytest.approx(4.0) and best.training_s == pytest.approx(4.0)
    assert best.weight_sync_s == pytest.approx(1.0) and best.link == "intra-node"
    assert best.step_s == pytest.approx(5.0)
    assert result.sync.iteration_s == pytest.approx(4.0) and result.splits_searched == 3


def test_training_dominated_gives_the_rollout_pool_fewer_devices(linear_costs):
    linear_costs(gen=4.0, train=12.0)
    # r=1: max(4, 12/3) + 1 = 5, the best; r=2: max(2, 6) + 1 = 7; r=3: max(4/3, 12) + 1 = 13.
    best = search_async(_toy_setting(per_node=4), 4).best
    assert (best.rollout.devices, best.training.devices) == (1, 3)
    assert (best.generation_s, best.training_s, best.step_s) == pytest.approx((4.0, 4.0, 5.0))


def test_pools_on_two_nodes_sync_over_the_network(linear_costs):
    linear_costs(gen=12.0, train=4.0)
    # 2 per node: a set takes 1 or 2 devices. r=1: max(12, 4/2) + 2 = 14; r=2: max(6, 4/2) + 2 = 8.
    best = search_async(_toy_setting(per_node=2), 4).best
    assert best.link == "inter-node" and best.weight_sync_s == pytest.approx(2.0)
    assert best.rollout.devices == 2 and best.step_s == pytest.approx(8.0)


def test_max_staleness_zero_sums_instead(linear_costs):
    linear_costs(gen=12.0, train=4.0)
    # No overlap: r=1: 12 + 4/3 + 1; r=2: 6 + 2 + 1 = 9; r=3: 4 + 4 + 1 = 9.
    best = search_async(_toy_setting(per_node=4), 4, overlap=False).best
    assert best.step_s == pytest.approx(9.0) == best.generation_s + best.training_s + best.weight_sync_s


def _grpo(response_tokens: int, epochs: int, micro_batch: int):
    return build_recipe({
        "algorithm": "grpo", "model": {"path": "qwen2.5-7b"},
        "data": {"train": "data/x.jsonl", "max_prompt_length": 512},
        "rollout": {"n": 8, "max_response_length": response_tokens},
        "trainer": {"mode": "async", "prompts_per_step": 64},
        "actor": {"epochs": epochs, "micro_batch_size": micro_batch, "mini_batch_size": 128},
        "cluster": {"gpus": 16, "gpu": "h100-80g"}}, {}, "async.yaml")


def test_the_split_follows_the_dominant_side_on_a_real_model():
    long_rollouts = plan_placement(_grpo(4096, epochs=1, micro_batch=1))  # generation dominates
    short_rollouts = plan_placement(_grpo(128, epochs=8, micro_batch=2))  # training dominates
    gen_heavy, train_heavy = long_rollouts["async"], short_rollouts["async"]
    assert gen_heavy["rollout_devices"] > train_heavy["rollout_devices"]
    assert gen_heavy["generation_s"] / gen_heavy["training_s"] > train_heavy["generation_s"] / train_heavy["training_s"]
    for plan in (long_rollouts, short_rollouts):
        a = plan["async"]
        assert a["step_s"] == pytest.approx(max(a["generation_s"], a["training_s"]) + a["weight_sync_s"], abs=2e-3)
        assert a["speedup"] == pytest.approx(a["sync_step_s"] / a["step_s"], rel=1e-3)
        # 7.6 B weights in bf16, to a rollout pool on the other node of 8.
        assert a["weight_sync_gb"] == pytest.approx(15.2, rel=0.01) and a["weight_sync_link"] == "inter-node"


def test_sync_mode_ignores_the_async_search():
    recipe = _grpo(256, epochs=1, micro_batch=2)
    plan = plan_placement(recipe, mode="sync")
    assert "async" not in plan and "rollout" not in plan["roles"]
    assert "generate" in plan["strategies"]["actor"]  # the actor generates itself, colocated
    with pytest.raises(UserError, match="trainer.mode 'both'.*accepted: sync, async"):
        plan_placement(recipe, mode="both")


@pytest.fixture(scope="module")
def invoke():
    import typer

    from hflow.cli.map import map as map_command

    app = typer.Typer()
    app.command("map")(map_command)
    app.command("other")(lambda: None)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["map", *map(str, args)])


def test_cli_set_trainer_mode_async_prints_the_async_lines_and_json(invoke):
    recipe = RECIPES / "grpo" / "qwen2.5-0.5b-gsm8k.yaml"  # a sync recipe: --set switches the mode
    args = (recipe, "--set", "trainer.mode=async", "--gpus", 8, "--gpu", "h100-80g")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "s per step, async (max(generation" in result.stdout
    assert "async: the rollout pool generates for" in result.stdout and "intra-node) = " in result.stdout
    assert "sync: the best synchronous plan, colocate on 8 device(s)" in result.stdout
    assert "rollout  " in result.stdout and "generate only" in result.stdout
    plan = json.loads(invoke(*args, "--json").stdout)
    a = plan["async"]
    assert {"generation_s", "training_s", "weight_sync_s", "step_s", "sync_step_s", "speedup"} <= set(a)
    assert plan["pools"][0]["name"] == "rollout" and plan["roles"]["rollout"]["pool"] == "rollout"
    assert plan["placement"][0] == ["rollout"] and sum(plan["gpus"]) <= 8
    for role, entry in plan["roles"].items():
        assert role in next(p["roles"] for p in plan["pools"] if p["name"] == entry["pool"])
    assert "generate" not in plan["strategies"]["actor"]  # the rollout pool generates, the actor trains
    assert plan["estimated_iteration_s"] == a["step_s"]
    assert a["rollout_devices"] + a["training_devices"] == plan["devices_used"]


def test_cli_async_recipe_on_cpu_slots_copies_in_memory(invoke, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # tiny_async's models/tiny need not exist: `init: tiny` gives its shape
    plan = json.loads(invoke(RECIPES / "grpo" / "tiny_async.yaml", "--gpus", 2, "--gpu", "cpu", "--json").stdout)
    assert plan["async"]["weight_sync_link"] == "memory copy"
    assert [pool["devices"] for pool in plan["pools"]] == [1, 1]


def test_cli_async_on_one_device_is_one_line_exit_2(invoke):
    recipe = RECIPES / "grpo" / "qwen2.5-0.5b-gsm8k.yaml"
    result = invoke(recipe, "--set", "trainer.mode=async", "--gpus", 1, "--gpu", "h100-80g")
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: trainer.mode async"), result.stderr
    assert "at least 2 devices" in lines[0] and "trainer.mode: sync" in lines[0]
