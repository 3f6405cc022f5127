"""The rollout assembly every engine shares: ragged rows padded, masked and laid out."""

import torch

from hflow.engine.padding import pad_rows
from hflow.engine.rollout.assembly import assemble_rollout


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


def test_untrained_tokens_are_attended_but_masked_out_of_the_loss():
    """A multi-turn response: the environment's tokens (trained 0) stay in the attention mask and
    the sequence, with response_mask 0 and a zeroed log-prob."""
    tokens = torch.tensor([[5, 6, 7, 8], [9, 9, 0, 0]])
    trained = torch.tensor([[1, 0, 0, 1], [1, 1, 0, 0]])
    logps = torch.full((2, 4), -0.5)
    out = assemble_rollout([[1], [2]], tokens, torch.tensor([4, 2]), 0, trained=trained, rollout_log_probs=logps)
    assert out["responses"].tolist() == [[5, 6, 7, 8], [9, 9, 0, 0]]
    assert out["response_mask"].tolist() == [[1, 0, 0, 1], [1, 1, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert out["rollout_log_probs"].tolist() == [[-0.5, 0, 0, -0.5], [-0.5, -0.5, 0, 0]]
