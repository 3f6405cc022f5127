"""Score models (reward, cost, critic): loading, last-token scores, the reward worker against
transformers, and the critic's values, update and exact save/load."""

import json
import shutil

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.rollout.generation import HFGenerator, SamplingParams
from hflow.engine.models.fused_layers import FusedMLP, FusedRMSNorm
from hflow.engine.models.loading import build_tiny_score_model, load_causal_lm, load_tokenizer
from hflow.engine.models.score_model import last_token_scores, load_score_model
from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.placement.worker_specs import worker_spec


@pytest.fixture(scope="module")
def tiny_scorer(tmp_path_factory):
    model, tokenizer = build_tiny_score_model(seed=1)
    out = tmp_path_factory.mktemp("models") / "scorer"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _rollout(tiny_model, n=2):
    """A real rollout batch (left-padded prompts, right-padded responses) from the tiny policy."""
    tok = load_tokenizer(str(tiny_model))
    engine = HFGenerator(load_causal_lm(str(tiny_model), torch.float32), [tok.eos_token_id], tok.pad_token_id, 64)
    texts = ["write digits: ", "say q: ", "a longer prompt than the others: "]
    prompts = [tok(t, add_special_tokens=False).input_ids for t in texts]
    out = engine.generate(prompts, n, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(0))
    return Batch(out, {"prompt": [t for t in texts for _ in range(n)]})


def test_last_token_scores_follow_the_attention_mask():
    scores = torch.arange(12.0).reshape(2, 6)
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])  # left and right padding
    assert last_token_scores(scores, mask).tolist() == [3.0, 11.0]


def test_from_a_causal_lm_a_new_seeded_head(tiny_model):
    a = load_score_model(str(tiny_model), torch.float32, seed=3)
    b = load_score_model(str(tiny_model), torch.float32, seed=3)
    torch.testing.assert_close(a.head.weight, b.head.weight)
    assert float(a.head.weight.std()) == pytest.approx(1 / 65, rel=0.2)  # std 1 / (hidden + 1)
    lm = load_causal_lm(str(tiny_model), torch.float32)
    torch.testing.assert_close(a.backbone.embed_tokens.weight, lm.model.embed_tokens.weight)
    ids = torch.randint(3, 50, (2, 5))
    assert a(ids, torch.ones_like(ids)).shape == (2, 5)
    assert isinstance(a.backbone.norm, FusedRMSNorm) and isinstance(a.backbone.layers[0].mlp, FusedMLP)


def test_reward_worker_matches_transformers_sequence_classifier(tiny_model, tiny_scorer):
    from transformers import AutoModelForSequenceClassification

    from hflow.engine.workers.reward import RewardWorker

    recipe = Recipe(model={"path": str(tiny_model)}, data={"train": "synthetic:digits"},
                    reward={"model": str(tiny_scorer)})
    worker = RewardWorker(worker_spec(recipe, "reward"))
    worker.init_model()
    assert worker.model_tokenizer is None  # same tokenizer as the actor: ids are scored as they are
    batch = _rollout(tiny_model)
    scores = worker.compute_reward(batch)["scores"]
    reference = AutoModelForSequenceClassification.from_pretrained(str(tiny_scorer)).eval()
    for row in range(len(batch)):
        keep = batch["attention_mask"][row].bool()
        with torch.no_grad():
            expected = reference(batch["input_ids"][row][keep][None]).logits[0, 0]
        assert float(scores[row]) == pytest.approx(float(expected), abs=1e-5)
    # Another tokenizer: prompt and response are re-tokenized as text; here that gives the same ids
    # for responses without special tokens (<pad>, <bos>, <eos> are ids 0-2; decoding drops them).
    worker.model_tokenizer = load_tokenizer(str(tiny_scorer))
    plain = [row for row in range(len(batch))
             if bool((batch["responses"][row][batch["response_mask"][row].bool()] > 2).all())]
    again = worker.compute_reward(batch)["scores"]
    assert plain and again[plain].tolist() == pytest.approx(scores[plain].tolist(), abs=1e-5)


def test_a_checkpoint_without_score_weights_is_refused(tiny_model, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["LlamaForSequenceClassification"]
    config["num_labels"] = 1
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="no weights for score.weight"):
        load_score_model(str(broken), torch.float32, what="reward.model")


def test_critic_values_update_and_exact_resume(tiny_model, tiny_scorer, tmp_path):
    from hflow.engine.workers.critic import CriticWorker

    ensure_process_group(torch.device("cpu"))
    recipe = Recipe(model={"path": str(tiny_model)}, data={"train": "synthetic:digits"}, algorithm="ppo",
                    reward={"model": str(tiny_scorer)}, critic={"lr": 1e-3, "micro_batch_size": 3},
                    actor={"micro_batch_size": 3},
                    rollout={"n": 2}, trainer={"prompts_per_step": 3, "total_steps": 5})
    critic = CriticWorker(worker_spec(recipe, "critic"))
    critic.init_model()
    # The critic starts as the reward model: its last-token output is the reward model's score.
    batch = _rollout(tiny_model)
    values = critic.compute_values(batch)["values"]
    assert values.shape == batch["responses"].shape
    assert bool((values[batch["response_mask"] == 0] == 0).all())
    batch |= Batch({"values": values, "returns": torch.full_like(values, 0.5) * batch["response_mask"]})
    losses = [critic.update_critic(batch)["critic/loss"] for _ in range(3)]
    assert losses[-1] < losses[0]
    critic.save_checkpoint(str(tmp_path / "critic"))
    after = critic.update_critic(batch)

    resumed = CriticWorker(worker_spec(recipe, "critic"))
    resumed.init_model(checkpoint=str(tmp_path / "critic"))
    assert resumed.update_critic(batch) == pytest.approx(after, rel=1e-6)


def test_tiny_cost_model_scores_high_digits_as_costly(tiny_model, tmp_path):
    from hflow.trainer.data.tiny_scorers import train_tiny_scorer
    from hflow.engine.workers.reward import CostWorker

    card = train_tiny_scorer(tmp_path / "cost", "cost", "digits", seed=0, steps=100)
    assert card["held_out_mean_abs_error"] < 0.08
    recipe = Recipe(model={"path": str(tiny_model)}, data={"train": "synthetic:digits"}, algorithm="safe_rlhf",
                    cost={"model": str(tmp_path / "cost")})
    worker = CostWorker(worker_spec(recipe, "cost"))
    worker.init_model()
    tok = worker.tokenizer
    prompt = tok("write digits: ", add_special_tokens=False).input_ids
    rows = [prompt + tok(r, add_special_tokens=False).input_ids for r in ("98765987", "01234012", "abcdefgh")]
    ids = torch.tensor(rows)
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(ids.shape[1]).expand_as(ids),
                   "responses": ids[:, len(prompt):], "response_mask": torch.ones_like(ids[:, len(prompt):])},
                  {"prompt": ["write digits: "] * 3})
    costs = worker.compute_cost(batch)["costs"]
    assert costs[0] > 0.7 and abs(float(costs[1])) < 0.15 and abs(float(costs[2])) < 0.15, costs


def _head_reference(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's hidden states (B, L, H) and the head computed on them in float32 (B, L)."""
    with torch.no_grad():
        hidden = model.backbone(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state
        weight, bias = model.head.weight.float(), model.head.bias
        expected = hidden.float() @ weight.T + (0 if bias is None else bias.float())
    return hidden, expected.squeeze(-1)


@pytest.mark.parametrize("source", ["causal_lm", "classifier"])
def test_the_head_keeps_float32_over_a_bfloat16_backbone(tiny_model, tiny_scorer, source):
    """A value or reward is one regression output: bf16's 8 significant bits would round it
    (3.14 -> 3.140625); the head's weights and output stay float32 whatever the backbone's dtype."""
    path = str(tiny_model if source == "causal_lm" else tiny_scorer)
    model = load_score_model(path, torch.bfloat16, seed=3).eval()
    assert {p.dtype for p in model.backbone.parameters()} == {torch.bfloat16}
    assert model.head.weight.dtype == torch.float32
    ids = torch.randint(3, 50, (2, 7))
    hidden, expected = _head_reference(model, ids)
    assert hidden.dtype == torch.bfloat16
    with torch.no_grad():
        scores = model(ids, torch.ones_like(ids))
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, expected, rtol=1e-6, atol=1e-7)
    assert not torch.equal(scores, scores.bfloat16().float())  # a bf16 output would have lost these bits


def test_the_critic_values_are_float32_under_deepspeed_bf16(tiny_model, tiny_scorer):
    """model.dtype bfloat16 on the CPU (DeepSpeed's bf16 mode): DeepSpeed casts every parameter
    to bf16, the head included (its fp32 master copy is the optimizer's), and the head still
    computes in float32: the values equal the fp32 head on the same hidden states; it trains."""
    from hflow.engine.workers.critic import CriticWorker

    ensure_process_group(torch.device("cpu"))
    recipe = Recipe(model={"path": str(tiny_model), "dtype": "bfloat16"}, data={"train": "synthetic:digits"},
                    algorithm="ppo", reward={"model": str(tiny_scorer)}, critic={"lr": 1e-3, "micro_batch_size": 3},
                    actor={"micro_batch_size": 3}, rollout={"n": 2}, trainer={"prompts_per_step": 3, "total_steps": 5})
    critic = CriticWorker(worker_spec(recipe, "critic"))
    critic.init_model()
    module = critic.train_engine.module
    assert critic.train_engine.engine.bfloat16_enabled()
    batch = _rollout(tiny_model)
    values = critic.compute_values(batch)["values"]
    assert values.dtype == torch.float32
    with torch.no_grad():
        hidden = module.backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 position_ids=batch["position_ids"], use_cache=False).last_hidden_state
        expected = (hidden.float() @ module.head.weight.float().T).squeeze(-1)
    width = batch["responses"].shape[1]
    torch.testing.assert_close(values, expected[:, -width - 1:-1] * batch["response_mask"], rtol=1e-6, atol=1e-7)
    batch |= Batch({"values": values, "returns": torch.full_like(values, 0.5) * batch["response_mask"]})
    losses = [critic.update_critic(batch)["critic/loss"] for _ in range(3)]
    assert losses[-1] < losses[0]


@pytest.mark.gpu
def test_the_head_keeps_float32_on_the_gpu(tiny_scorer):
    device = torch.device("cuda", torch.cuda.current_device())
    model = load_score_model(str(tiny_scorer), torch.bfloat16).to(device).eval()
    assert model.head.weight.dtype == torch.float32
    ids = torch.randint(3, 50, (2, 7), device=device)
    hidden, expected = _head_reference(model, ids)
    with torch.no_grad():
        scores = model(ids, torch.ones_like(ids))
    assert hidden.dtype == torch.bfloat16 and scores.dtype == torch.float32
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-6)  # TF32 may differ in the last bits
