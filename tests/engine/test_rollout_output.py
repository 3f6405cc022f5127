"""The shared rollout assembly reproduces the hf engine's output exactly, and pads ragged rows."""

import torch

from hflow.engine.generation import HFGenerator, SamplingParams
from hflow.engine.models import load_causal_lm, load_tokenizer
from hflow.engine.rollout_output import assemble_rollout, pad_rows


def test_assemble_rollout_reproduces_hf_engine_output(tiny_model):
    tok = load_tokenizer(str(tiny_model))
    engine = HFGenerator(load_causal_lm(str(tiny_model), torch.float32), [tok.eos_token_id], tok.pad_token_id, 64)
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ["write digits: ", "a longer prompt here: "]]
    out = engine.generate(prompts, 3, SamplingParams(max_new_tokens=10), torch.Generator().manual_seed(3))
    rows = [p for p in prompts for _ in range(3)]
    rebuilt = assemble_rollout(rows, out["responses"], out["response_mask"].sum(-1), tok.pad_token_id,
                               rollout_log_probs=out["rollout_log_probs"], rollout_entropy=out["rollout_entropy"])
    assert rebuilt.keys() == out.keys()
    for key in out:
        assert torch.equal(rebuilt[key], out[key]), key


def test_ragged_rows_are_right_padded_and_masked():
    tokens = pad_rows([[5, 6, 7], [8], []], fill=0, dtype=torch.long)
    logps = pad_rows([[-0.1, -0.2, -0.3], [-0.4], []], fill=0.0, dtype=torch.float32)
    out = assemble_rollout([[1, 2], [3], [4, 4, 4]], tokens, torch.tensor([3, 1, 0]), 0, rollout_log_probs=logps)
    assert out["responses"].tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert out["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert out["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert out["input_ids"][1].tolist() == [0, 0, 3, 8, 0, 0]
    assert out["position_ids"][0].tolist() == [0, 0, 1, 2, 3, 4]
    torch.testing.assert_close(out["rollout_log_probs"][1], torch.tensor([-0.4, 0.0, 0.0]))
