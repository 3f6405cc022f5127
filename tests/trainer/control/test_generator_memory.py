"""A generator with weights of its own (vLLM, or ZeRO-3's gathered copy) gives its memory back before a
colocated model scores the step: no model runs beside a woken generator (`Session.generator_owns_memory`)."""

import pytest

from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.workers.actor import ActorWorker
from hflow.engine.workers.reference import ReferenceWorker
from hflow.engine.workers.reward import RewardWorker
from hflow.trainer.algorithms import grpo
from hflow.trainer.config.load import build_recipe
from hflow.trainer.rundir.writer import RunDir


def _recording(monkeypatch, calls, cls, name, dispatch, label):
    real = getattr(cls, name)

    def record(self, *args, **kwargs):
        calls.append(label)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, register(dispatch)(record))


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_scoring_waits_for_the_generator_to_release_its_memory(monkeypatch, tmp_path, tiny_model, zero_stage):
    calls: list = []
    _recording(monkeypatch, calls, ActorWorker, "generate_sequences", Dispatch.DP_COMPUTE, "generate")
    _recording(monkeypatch, calls, ActorWorker, "end_rollout", Dispatch.ONE_TO_ALL, "end_rollout")
    _recording(monkeypatch, calls, ReferenceWorker, "compute_ref_log_prob", Dispatch.DP_COMPUTE, "reference")
    _recording(monkeypatch, calls, RewardWorker, "compute_reward", Dispatch.DP_COMPUTE, "reward")
    recipe = build_recipe({
        "name": "memory", "algorithm": "grpo", "model": {"path": str(tiny_model)},
        "data": {"train": "synthetic:digits", "synthetic_size": 64},
        "rollout": {"n": 2, "max_response_length": 4, "stream_prompts": 2},  # two chunks a step
        "actor": {"micro_batch_size": 8, "zero_stage": zero_stage},
        "grpo": {"kl_coef": 0.05},  # a reference model, on the actor's devices (colocated)
        "trainer": {"total_steps": 2, "prompts_per_step": 4, "save_every": 0},
        "logging": {"progress": "lines"},
    }, {}, "test")
    run = RunDir.create(recipe, str(tmp_path / "runs"))
    try:
        grpo.train(recipe, run)
    finally:
        run.close()
    names = calls
    assert names.count("generate") == 4 and names.count("reference") == 4 and names.count("reward") == 4
    if zero_stage == 1:  # the generator is the training module itself: chunks stream into scoring
        assert "end_rollout" not in names
        return
    for step in (names[:len(names) // 2], names[len(names) // 2:]):
        # Both chunks generated, the generator released, and only then the scoring models.
        assert step[:3] == ["generate", "generate", "end_rollout"], names
        assert set(step[3:]) == {"reference", "reward"}
