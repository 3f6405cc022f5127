"""The actor loaded for generation alone (an evaluation, `ActorWorker.init_generation`) against the
actor loaded to train from the same checkpoint (the reference): the same evaluation rollout, token
for token, with no training engine, gradients or optimizer state; full weights and LoRA adapters,
float32 and bfloat16, ZeRO-3's partitions."""

import pytest
import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.models.loading import load_tokenizer
from hflow.trainer.config.load import build_recipe
from hflow.trainer.data.prompts import PromptData
from hflow.trainer.placement.worker_groups import build_worker_groups

EVAL = {"n": 2, "temperature": 1.0, "max_response_length": 12, "batch_size": None}


def _recipe(model, dtype, lora, zero):
    actor = {"lr": 0.05, "micro_batch_size": 8, "mini_batch_size": 8, "zero_stage": zero}
    if lora:
        actor["lora"] = {"rank": 4}
    return build_recipe({
        "model": {"path": str(model), "dtype": dtype}, "data": {"train": "synthetic:digits", "synthetic_size": 16},
        "rollout": {"n": 2, "max_response_length": 12}, "actor": actor, "trainer": {"prompts_per_step": 4},
    }, {}, "test")


def _actor(recipe):
    return build_worker_groups(recipe, ["actor"], torch.device("cpu"))["actor"]


def _eval_rollout(actor, prompts: Batch) -> Batch:
    return actor.generate_sequences(Batch(columns=dict(prompts.columns), meta={"step": 1, "eval": EVAL}))


@pytest.mark.parametrize("dtype, lora, zero", [("float32", False, 1), ("bfloat16", False, 1), ("bfloat16", True, 1),
                                              ("float32", False, 3)])
def test_generation_alone_samples_what_the_training_actor_samples(tiny_model, tmp_path, dtype, lora, zero):
    recipe = _recipe(tiny_model, dtype, lora, zero)
    prompts = PromptData(recipe.data, load_tokenizer(str(tiny_model)), 0, 4).batch(1)
    trained = _actor(recipe)
    trained.init_model()
    batch = trained.generate_sequences(prompts)
    batch |= Batch({col.ADVANTAGES: torch.randn(len(batch), generator=torch.Generator().manual_seed(0)),
                    col.OLD_LOG_PROBS: batch[col.ROLLOUT_LOG_PROBS]})
    trained.update_actor(batch)
    trained.save_checkpoint(str(tmp_path / "actor"))

    reference, alone = _actor(recipe), _actor(recipe)
    reference.init_model(checkpoint=str(tmp_path / "actor"))
    alone.init_generation(checkpoint=str(tmp_path / "actor"))
    base = _actor(recipe)
    base.init_generation()

    want, got = _eval_rollout(reference, prompts), _eval_rollout(alone, prompts)
    for key in (col.RESPONSES, col.RESPONSE_MASK, col.ROLLOUT_LOG_PROBS):
        assert torch.equal(got[key], want[key]), key
    # The checkpoint's policy, not the model folder's: the update shows in the log-probs.
    assert not torch.equal(_eval_rollout(base, prompts)[col.ROLLOUT_LOG_PROBS], want[col.ROLLOUT_LOG_PROBS])

    worker = alone.worker
    assert worker.train_engine is None and worker.phases.training_state_bytes() == 0
    params = list(worker.phases.module.parameters())
    # Under ZeRO-3 the policy stays partitioned, as in training; its rollout runs on gathered weights.
    assert all(hasattr(p, "ds_id") for p in params) == (zero == 3)
    assert params and not any(p.requires_grad or p.grad is not None for p in params)
    assert {p.dtype for p in params} == {getattr(torch, dtype)}
