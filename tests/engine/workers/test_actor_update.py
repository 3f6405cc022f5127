"""The actor update: micro-batching by token budget, reusing the sampler's log-probs, and scoring in
micro-batches of their own."""

import pytest
import torch
from helpers import assert_same_adam_step

from hflow.engine.groups.batch import Batch
from hflow.engine.models.loading import load_tokenizer
from hflow.trainer.data.prompts import PromptData
from hflow.trainer.placement.worker_groups import build_worker_groups
from hflow.trainer.placement.worker_specs import critic_spec, reference_spec, scorer_spec
from hflow.trainer.config.load import build_recipe


def _recipe(model, data=None, **actor):
    return build_recipe({
        "model": {"path": str(model)},
        "data": data or {"train": "synthetic:digits", "synthetic_size": 32},
        "rollout": {"n": 4, "max_response_length": 16},
        "actor": {"lr": 0.01, "micro_batch_size": 16, "mini_batch_size": 16, **actor},
        "trainer": {"prompts_per_step": 4},
    }, {}, "test")


def _rollout_and_update(recipe, model):
    groups = build_worker_groups(recipe, ["actor"], torch.device("cpu"))
    actor = groups["actor"]
    actor.init_model()
    prompts = PromptData(recipe.data, load_tokenizer(str(model)), 0, 4).batch(1)
    batch = actor.generate_sequences(prompts)
    if recipe.actor.recompute_old_log_probs:
        batch |= actor.compute_log_prob(batch)
    batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(0))})
    metrics = actor.update_actor(batch)
    weights = {k: v.detach().clone() for k, v in actor.worker.train_engine.module.state_dict().items()}
    return batch, metrics, weights


def test_token_budget_micro_batches_give_the_same_update(tiny_model):
    _, m_whole, whole = _rollout_and_update(_recipe(tiny_model), tiny_model)
    _, m_small, small = _rollout_and_update(_recipe(tiny_model, micro_batch_tokens=40), tiny_model)
    assert m_small["actor/grad_norm"] == pytest.approx(m_whole["actor/grad_norm"], rel=1e-5)
    assert m_small["actor/loss"] == pytest.approx(m_whole["actor/loss"], rel=1e-5, abs=1e-7)
    assert_same_adam_step(small, whole, lr=0.01)


def test_a_prompt_header_held_through_the_update_s_micro_batches_gives_the_same_update(tiny_model, tmp_path,
                                                                                       monkeypatch):
    """Prompts after the same 54-character header, the update cut into micro-batches by a token
    budget: the header runs once for them all (held with its gradients), and the step is the one
    of a single micro-batch, where it runs once anyway."""
    import json

    from hflow.engine.training import packed
    from hflow.trainer.data.tasks import make_rows

    header = "you are a careful assistant. answer with digits only. "
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({**row, "prompt": header + row["prompt"]}) + "\n"
                            for row in make_rows("digits", 32, seed=0)))
    runs = []
    run = packed.run_prefix_alone
    monkeypatch.setattr(packed, "run_prefix_alone",
                        lambda forward, held: runs.append(held.length) or run(forward, held))
    rows = {"train": str(data), "max_prompt_length": 96}

    _, m_whole, whole = _rollout_and_update(_recipe(tiny_model, rows), tiny_model)
    assert runs == []  # one micro-batch: the header runs once in it
    _, m_small, small = _rollout_and_update(_recipe(tiny_model, rows, micro_batch_tokens=100), tiny_model)
    assert len(runs) == 1 and runs[0] >= len(header) - 2, runs
    assert m_small["actor/grad_norm"] == pytest.approx(m_whole["actor/grad_norm"], rel=1e-5)
    assert m_small["actor/loss"] == pytest.approx(m_whole["actor/loss"], rel=1e-5, abs=1e-7)
    assert_same_adam_step(small, whole, lr=0.01)


def test_reused_rollout_log_probs_match_recomputed(tiny_model):
    recomputed, _, _ = _rollout_and_update(_recipe(tiny_model), tiny_model)
    reused, _, _ = _rollout_and_update(_recipe(tiny_model, recompute_old_log_probs=False), tiny_model)
    mask = recomputed["response_mask"].bool()
    assert torch.equal(reused["responses"], recomputed["responses"])
    torch.testing.assert_close(reused["old_log_probs"][mask], recomputed["old_log_probs"][mask],
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(reused["entropy"][mask], recomputed["entropy"][mask], rtol=1e-4, atol=1e-5)


def _scored(recipe, model):
    """The old policy's log-probs of one rollout, and how many forwards the model ran for them."""
    groups = build_worker_groups(recipe, ["actor"], torch.device("cpu"))
    actor = groups["actor"]
    actor.init_model()
    batch = actor.generate_sequences(PromptData(recipe.data, load_tokenizer(str(model)), 0, 4).batch(1))
    forwards = []
    hook = actor.worker.train_engine.module.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        scored = actor.compute_log_prob(batch)
    finally:
        hook.remove()
    return batch, scored, len(forwards)


def test_a_scoring_micro_batch_of_its_own_scores_the_same_in_fewer_forwards(tiny_model):
    # 16 sequences: the training micro-batch of 4 scores them in 4 passes, a scoring one of 16 in one.
    batch, small, small_forwards = _scored(_recipe(tiny_model, micro_batch_size=4), tiny_model)
    _, whole, whole_forwards = _scored(_recipe(tiny_model, micro_batch_size=4, score_micro_batch_size=16),
                                       tiny_model)
    assert small_forwards == 4 * whole_forwards > 0
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(whole["old_log_probs"][mask], small["old_log_probs"][mask], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(whole["entropy"][mask], small["entropy"][mask], rtol=1e-4, atol=1e-5)


def test_every_scoring_role_takes_its_section_s_scoring_micro_batch(tiny_model):
    recipe = build_recipe({
        "algorithm": "ppo", "model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits"},
        "actor": {"micro_batch_size": 4, "score_micro_batch_size": 32}, "critic": {"micro_batch_size": 2},
        "trainer": {"prompts_per_step": 8},
    }, {}, "test")
    assert reference_spec(recipe).micro_batch_size == 32
    assert scorer_spec(recipe, "reward").micro_batch_size == 32
    critic = critic_spec(recipe, str(tiny_model)).optim
    assert (critic.micro_batch_size, critic.score_micro_batch_size) == (2, 2)  # default: the training one
