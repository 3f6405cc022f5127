import torch

from hflow.engine.batch import Batch
from hflow.engine.packing import token_budget_groups, trim_padding


def _batch():
    # prompts (P=4) left-padded: lengths 2 and 3; responses (R=5) right-padded: lengths 1 and 3
    attention = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0],
                              [0, 1, 1, 1, 1, 1, 1, 0, 0]])
    response_mask = attention[:, 4:]
    ids = torch.arange(18).view(2, 9)
    return Batch({"input_ids": ids, "attention_mask": attention, "position_ids": ids * 0,
                  "response_mask": response_mask, "old_log_probs": torch.randn(2, 5),
                  "advantages": torch.tensor([1.0, -1.0])}, {"prompt": ["a", "b"]})


def test_trim_padding_cuts_shared_padding_only():
    b = _batch()
    t = trim_padding(b)
    # one leading prompt column is padding in both rows; responses need 3 of 5 columns
    assert t["input_ids"].tolist() == [b["input_ids"][0, 1:7].tolist(), b["input_ids"][1, 1:7].tolist()]
    assert t["response_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert torch.equal(t["old_log_probs"], b["old_log_probs"][:, :3])
    assert torch.equal(t["advantages"], b["advantages"]) and t["prompt"] == ["a", "b"]
    # every real token survives
    assert int(t["attention_mask"].sum()) == int(b["attention_mask"].sum())


def test_trimmed_log_probs_equal_untrimmed(tiny_model):
    from hflow.engine.logprobs import response_log_probs
    from hflow.engine.models import load_causal_lm

    model = load_causal_lm(str(tiny_model), torch.float32)
    b = _batch()
    b.tensors["input_ids"] = torch.randint(3, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    b.tensors["position_ids"] = (b["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    b.tensors["responses"] = b["input_ids"][:, 4:]
    with torch.no_grad():
        full, _ = response_log_probs(model, b, 1.0)
        trimmed, _ = response_log_probs(model, trim_padding(b), 1.0)
    mask = b["response_mask"].bool()
    torch.testing.assert_close(trimmed[mask[:, :3]], full[mask], rtol=1e-5, atol=1e-5)


def test_token_budget_groups_respect_the_budget():
    prompts = torch.full((6,), 2)
    responses = torch.tensor([8, 1, 7, 2, 0, 28])  # rows of 10, 3, 9, 4, 2 and 30 tokens
    groups = token_budget_groups(prompts, responses, max_tokens=20)
    # 30 alone (over the budget); 2 rows x 10 columns; 3 rows x 4 columns. Cost with one widest
    # row (30) per group: 30 + 20 + 12 + 3 x 30 = 152; splitting [3, 1, 4] further costs more.
    assert groups == [[5], [0, 2], [3, 1, 4]]
    assert len(token_budget_groups(prompts, responses, max_tokens=1000, min_groups=3)) == 3


def test_token_budget_groups_split_only_where_it_saves_more_than_a_row():
    prompts = torch.ones(6, dtype=torch.long)
    # Widths 10, 10, 10, 2, 2, 2: one group pads to 6 x 10 + 10 = 70; two cost 30 + 6 + 2 x 10 = 56.
    uneven = token_budget_groups(prompts, torch.tensor([9, 9, 9, 1, 1, 1]), max_tokens=1000)
    assert uneven == [[0, 1, 2], [3, 4, 5]]
    # Widths 10, 10, 10, 9, 9, 9: one group costs 70, two 30 + 27 + 20 = 77.
    even = token_budget_groups(prompts, torch.tensor([9, 9, 9, 8, 8, 8]), max_tokens=1000)
    assert even == [[0, 1, 2, 3, 4, 5]]
    # A group's width is its longest prompt plus its longest response, not its longest row.
    mixed = token_budget_groups(torch.tensor([8, 1, 8]), torch.tensor([1, 8, 1]), max_tokens=1000)
    assert sorted(map(sorted, mixed)) == [[0, 2], [1]]  # 2 x 9 + 9 + 2 x 16 = 59 < 3 x 16 + 16 = 64
