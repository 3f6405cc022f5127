"""`hflow bench`: each measurement runs on a tiny recipe and reports sensible numbers."""

import json

import pytest
import torch

from typer.testing import CliRunner

from hflow.cli.app import app
from helpers import write_recipe


def _bench(*args):
    result = CliRunner().invoke(app, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_bench_rollout_switch_and_step(tmp_path, tiny_model):
    recipe = str(write_recipe(tmp_path / "r.yaml", tiny_model))
    rollout = _bench("rollout", recipe, "--repeats", "2")
    assert rollout["sequences"] == 32 and rollout["response_tokens_per_s"] > 0
    assert rollout["tokens_per_s"] > rollout["response_tokens_per_s"]  # prompts count too

    switch = _bench("switch", recipe, "--repeats", "2")
    rank = switch["ranks"][0]
    assert switch["switch_s"] == switch["to_rollout_s"] + switch["to_scoring_s"] + switch["to_train_s"]
    # the switch moves no weights: resident memory does not grow across it
    assert rank["memory_in_rollout_bytes"] - rank["memory_before_bytes"] < rank["training_state_bytes"]
    phases = rank["phases"]
    assert list(phases) == ["train", "rollout", "scoring", "train_again"]
    assert phases["rollout"]["generator_weights_bytes"] == 0  # hf: it generates on the training weights

    step = _bench("step", recipe, "--repeats", "3")
    assert step["steps"] == 2 and step["tokens_per_s"] > 0
    assert 0 < step["actor_update_flops_per_s"] < 10 * step["matmul_peak_flops_per_s"]
    # the tiny recipe's n rows share each prompt: the nominal rate counts them once per row
    assert step["actor_update_nominal_flops_per_s"] > step["actor_update_flops_per_s"]
    assert step["matmul_peak_dtype"] == "float32"  # the recipe's dtype on its device
    assert {"generate", "update_actor"} <= set(step["stages_s"])
    _check_account(step["account"])


def _check_account(account):
    """Every phase computed at least what it needed, reached a share of its limit between 0 and a
    sane bound (1 is the machine's best; the peaks are measured on a noisy machine), and the step
    line adds the phases up."""
    from hflow.trainer.work.bench_account import table

    phases = account["phases"]
    assert {"generate", "old_log_prob", "reference", "update_actor"} <= set(phases)
    for name, phase in phases.items():
        assert phase["needed_flops"] > 0 and phase["needed_bytes"] > 0 and phase["limit_s"] > 0, name
        assert phase["computed_over_needed"] >= 1, (name, phase)
        assert 0 < phase["share_of_limit"] < 5, (name, phase)
    step = account["step"]
    assert step["needed_flops"] == pytest.approx(sum(p["needed_flops"] for p in phases.values()))
    assert step["limit_s"] == pytest.approx(sum(p["limit_s"] for p in phases.values()))
    assert 0 < step["min_memory_bytes"] < step["peak_memory_bytes"]
    assert account["peaks"]["matmul_1024_flops_per_s"] > 0 and account["peaks"]["bandwidth_bytes_per_s"] > 0
    # generation and the update are work that runs in order, each part with its own limit
    assert set(phases["generate"]["parts"]) >= {"prefill"} and set(phases["update_actor"]["parts"]) == {
        "passes", "optimizer"}
    lines = table(account)
    heads = [line.split()[0] for line in lines[1:] if not line.startswith("  ")]
    assert lines[0].split()[:2] == ["phase", "GFLOP"] and heads[:len(phases) + 1] == [*phases, "step"]
    parts = [line.split()[0] for line in lines[1:] if line.startswith("  ")]
    assert parts == [name for phase in phases.values() for name, part in phase["parts"].items() if part["passes"]]


def test_bench_switch_states_the_gathered_generators_memory_per_phase(tmp_path, tiny_model):
    """ZeRO-3's hf generator holds whole weights in rollout only: the budget says so, phase by phase."""
    recipe = str(write_recipe(tmp_path / "r.yaml", tiny_model, actor={"zero_stage": 3}))
    phases = _bench("switch", recipe, "--repeats", "1")["ranks"][0]["phases"]
    from hflow.engine.models.loading import load_causal_lm

    weights = sum(p.numel() * 4 for p in load_causal_lm(str(tiny_model), torch.float32).parameters())
    assert phases["rollout"]["generator_weights_bytes"] == weights  # fp32 on the CPU
    assert phases["scoring"]["generator_weights_bytes"] == 0
