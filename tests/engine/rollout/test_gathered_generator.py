"""The `hf` engine under ZeRO-3 generates on whole weights gathered once per rollout
(`gathered_generator.py`), not through the partitioned training module token by token."""

import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.models.loading import load_tokenizer
from hflow.engine.rollout.gathered_generator import GatheredGenerator
from hflow.trainer.config.load import build_recipe
from hflow.trainer.placement.worker_groups import build_worker_groups
from hflow.trainer.data.prompts import PromptData


def _actor(model, zero_stage):
    recipe = build_recipe({
        "model": {"path": str(model)}, "data": {"train": "synthetic:digits", "synthetic_size": 32},
        "rollout": {"n": 4, "max_response_length": 12},
        "actor": {"lr": 0.01, "micro_batch_size": 16, "mini_batch_size": 16, "zero_stage": zero_stage},
        "trainer": {"prompts_per_step": 4},
    }, {}, "test")
    actor = build_worker_groups(recipe, ["actor"], torch.device("cpu"))["actor"]
    actor.init_model()
    return recipe, actor


def _step(recipe, model, actor, step):
    prompts = PromptData(recipe.data, load_tokenizer(str(model)), 0, 4).batch(step)
    batch = actor.generate_sequences(prompts)
    batch |= actor.compute_log_prob(batch)
    batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(step))})
    actor.update_actor(batch)
    return batch


def test_zero3_rollouts_equal_zero1_and_never_run_the_partitioned_module(tiny_model):
    recipe, zero1 = _actor(tiny_model, 1)
    _, zero3 = _actor(tiny_model, 3)
    worker = zero3.worker
    assert isinstance(worker.generator, GatheredGenerator) and worker.generator.generator.fast
    forwards = []
    module = worker.train_engine.module
    original = module.forward
    module.forward = lambda *a, **k: forwards.append(worker.phases.phase) or original(*a, **k)
    for step in (1, 2):  # the second rollout samples from the weights the first update trained
        a, b = _step(recipe, tiny_model, zero1, step), _step(recipe, tiny_model, zero3, step)
        assert torch.equal(a["responses"], b["responses"]), step
        torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], rtol=1e-5, atol=1e-5)
        # Outside the rollout the whole weights are gone again: the memory is training's.
        assert worker.phases.phase == "train"
        assert all(p.numel() == 0 for p in worker.generator.params.values())
    # The partitioned module ran only to score and train, never while generating.
    assert forwards and "rollout" not in forwards
