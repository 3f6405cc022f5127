"""Under the actor's ZeRO-3 the frozen models are partitioned too (`training/zero3.py`), and score
exactly as whole models do."""

import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.models.loading import build_tiny_score_model
from hflow.engine.training.zero3 import is_partitioned
from hflow.engine.specs import ModelSpec, ReferenceSpec, ScorerSpec
from hflow.engine.workers.reference import ReferenceWorker
from hflow.engine.workers.reward import RewardWorker


def _rollout(vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (4, 10), generator=g)
    mask = torch.ones_like(ids)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1,
                  "responses": ids[:, 6:], "response_mask": mask[:, 6:]}, {"prompt": ["x"] * 4})


def test_reference_and_reward_model_partitioned_under_zero3(tiny_model, tmp_path):
    ensure_process_group(torch.device("cpu"))
    model, tokenizer = build_tiny_score_model()
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    batch = _rollout(len(tokenizer))
    out = {}
    for zero in (0, 3):
        reference = ReferenceWorker(ReferenceSpec(ModelSpec(str(tiny_model)), 1.0, 2, zero_stage=zero))
        reference.init_model()
        reward = RewardWorker(ScorerSpec("reward", ModelSpec(str(tiny_model)), ModelSpec(str(tmp_path / "rm")),
                                         None, None, 2, zero_stage=zero))
        reward.init_model()
        for worker in (reference, reward):
            module = getattr(worker.model, "module", worker.model)
            assert is_partitioned(module) == (zero == 3)
        out[zero] = (reference.compute_ref_log_prob(batch)["ref_log_probs"], reward.compute_reward(batch)["scores"])
    torch.testing.assert_close(out[3][0], out[0][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[3][1], out[0][1], rtol=1e-5, atol=1e-6)
