"""A run that fails inside the session is marked failed at its last completed step, and its
progress display and wandb run are closed as failed (Session.__exit__ -> Session.fail)."""

from __future__ import annotations

import json

import pytest

import faulty_rewards
from hflow.trainer.algorithms import grpo
from hflow.trainer.config.load import build_recipe
from hflow.trainer.control import session as session_module
from hflow.trainer.rundir.writer import RunDir


class RecordingWandb:
    """Stands in for WandbLogger: records what the session logs and how it finishes."""

    instances: list["RecordingWandb"] = []

    def __init__(self, cfg, run_dir, recipe):
        self.steps, self.finished = [], []
        RecordingWandb.instances.append(self)

    def log(self, event):
        self.steps.append(event["step"])

    def finish(self, status):
        self.finished.append(status)


def test_a_failing_reward_marks_the_run_failed_and_closes_everything(tiny_model, tmp_path, monkeypatch):
    faulty_rewards._calls["n"] = 0  # the function fails at its second call: step 2's reward
    monkeypatch.setattr(session_module, "WandbLogger", RecordingWandb)
    closed = []
    monkeypatch.setattr(session_module.Progress, "close", lambda self, events: closed.append(events))
    recipe = build_recipe({
        "name": "failing", "algorithm": "grpo", "model": {"path": str(tiny_model)},
        "data": {"train": "synthetic:digits", "synthetic_size": 64},
        "reward": {"function": "faulty_rewards:raises_at_second_call"},
        "rollout": {"n": 2, "max_response_length": 4},
        "actor": {"micro_batch_size": 4},
        "trainer": {"total_steps": 3, "prompts_per_step": 2, "save_every": 0},
        "logging": {"progress": "lines", "wandb": {"enabled": True, "mode": "offline"}},
    }, {}, "test")
    run = RunDir.create(recipe, str(tmp_path / "runs"))
    try:
        with pytest.raises(Exception, match="the reward service is down"):
            grpo.train(recipe, run)
    finally:
        run.close()
    status = json.loads((run.path / "status.json").read_text())
    assert status["status"] == "failed" and status["step"] == 1
    assert "the reward service is down" in status["error"]
    assert closed == [None]  # the progress display closed, without a summary
    (wandb,) = RecordingWandb.instances
    assert wandb.steps == [1] and wandb.finished == ["failed"]


def test_failure_messages_are_one_line_for_people():
    from hflow.engine.groups.worker import WorkerError
    from hflow.errors import UserError

    assert session_module.failure_message(KeyboardInterrupt()) == "interrupted"
    assert session_module.failure_message(UserError("data.train: no such file")) == "data.train: no such file"
    assert session_module.failure_message(WorkerError("reward", 0, "boom")).endswith("boom")
    assert session_module.failure_message(RuntimeError("x")) == "RuntimeError: x"
