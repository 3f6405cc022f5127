"""NaN in a step: `trainer.on_nonfinite: skip_step` logs the step without an update and goes
on; a non-finite loss ends the run before the step is logged or saved (Session.finite_scores,
Session.end_step, trainer/control/nonfinite.py)."""

from __future__ import annotations

import functools
import json
import math

import pytest
from safetensors.torch import load_file

import faulty_rewards
from helpers import read_events
from hflow.engine.workers.actor import ActorWorker
from hflow.errors import RunFailed
from hflow.trainer.algorithms import grpo
from hflow.trainer.config.load import build_recipe
from hflow.trainer.control.nonfinite import check_update
from hflow.trainer.rundir.writer import RunDir


def _run(tiny_model, tmp_path, **trainer):
    recipe = build_recipe({
        "name": "nonfinite", "algorithm": "grpo", "model": {"path": str(tiny_model)},
        "data": {"train": "synthetic:digits", "synthetic_size": 64},
        "reward": {"function": "faulty_rewards:one_nan_at_second_call"},
        "rollout": {"n": 2, "max_response_length": 4},
        "actor": {"micro_batch_size": 4, "lr": 0.01},
        "trainer": {"total_steps": 3, "prompts_per_step": 2, "save_every": 1, "keep_checkpoints": 3, **trainer},
        "logging": {"progress": "lines"},
    }, {}, "test")
    return recipe, RunDir.create(recipe, str(tmp_path / "runs"))


def _actor_weights(run, step):
    return load_file(run.path / "checkpoints" / f"step_{step:06d}" / "actor" / "weights.safetensors")


def test_skip_step_logs_the_step_without_an_update_and_goes_on(tiny_model, tmp_path):
    faulty_rewards._calls["n"] = 0  # step 2's first score is NaN
    recipe, run = _run(tiny_model, tmp_path, on_nonfinite="skip_step")
    try:
        grpo.train(recipe, run)
    finally:
        run.close()
    assert json.loads((run.path / "status.json").read_text())["status"] == "finished"
    events = read_events(run.path)
    assert [e["step"] for e in events] == [1, 2, 3]
    assert "nonfinite/skipped_steps" not in events[0]
    assert [e["nonfinite/skipped_steps"] for e in events[1:]] == [1, 1]  # cumulative
    assert "actor/loss" not in events[1] and "actor/loss" in events[2]  # no update at step 2
    assert all(math.isfinite(v) for e in events for v in e.values() if isinstance(v, float))
    assert events[1]["reward/min"] >= 0  # the 15 finite scores
    one, two, three = (_actor_weights(run, s) for s in (1, 2, 3))
    assert all((one[k] == two[k]).all() for k in one)  # the skipped step left the actor as it was
    assert any((two[k] != three[k]).any() for k in two)


def test_a_nan_loss_ends_the_run_before_the_step_is_saved(tiny_model, tmp_path, monkeypatch):
    faulty_rewards._calls["n"] = -100  # no NaN score: the loss diverges instead
    original = ActorWorker.update_actor
    calls = []

    @functools.wraps(original)
    def nan_at_second_update(self, batch):
        metrics = original(self, batch)
        calls.append(1)
        return {**metrics, "actor/loss": float("nan")} if len(calls) == 2 else metrics

    monkeypatch.setattr(ActorWorker, "update_actor", nan_at_second_update)
    recipe, run = _run(tiny_model, tmp_path)
    try:
        with pytest.raises(RunFailed, match=r"^the actor update diverged at step 2 \(actor/loss=nan\)"):
            grpo.train(recipe, run)
    finally:
        run.close()
    status = json.loads((run.path / "status.json").read_text())
    assert status["status"] == "failed" and status["step"] == 1 and "diverged at step 2" in status["error"]
    assert [e["step"] for e in read_events(run.path)] == [1]
    assert not (run.path / "checkpoints" / "step_000002").exists()


def test_check_update_names_every_non_finite_loss_and_grad_norm():
    check_update(4, {"critic/loss": 0.5, "critic/grad_norm": 1.0, "critic/lr": 1e-5})
    with pytest.raises(RunFailed, match=r"critic update diverged at step 4 \(critic/loss=inf, critic/grad_norm=nan\)"):
        check_update(4, {"critic/loss": float("inf"), "critic/grad_norm": float("nan"), "critic/lr": 1e-5})
