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
    lengths = torch.tensor([10, 3, 9, 4, 2, 30])
    groups = token_budget_groups(lengths, max_tokens=20)
    # 30 alone (over the budget); 2 rows x 10 columns; 3 rows x 4 columns. Cost with one longest
    # row (30) per group: 30 + 20 + 12 + 3 x 30 = 152; splitting [3, 1, 4] further costs more.
    assert groups == [[5], [0, 2], [3, 1, 4]]
    assert len(token_budget_groups(lengths, max_tokens=1000, min_groups=3)) == 3


def test_token_budget_groups_split_only_where_it_saves_more_than_a_row():
    # One group pads to 6 x 10 + 10 = 70; two cost 30 + 6 + 2 x 10 = 56.
    assert token_budget_groups(torch.tensor([10, 10, 10, 2, 2, 2]), max_tokens=1000) == [[0, 1, 2], [3, 4, 5]]
    # One group costs 70, two 30 + 27 + 20 = 77.
    assert token_budget_groups(torch.tensor([10, 10, 10, 9, 9, 9]), max_tokens=1000) == [[0, 1, 2, 3, 4, 5]]


def test_response_log_probs_equal_each_row_alone(tiny_model):
    """The left-aligned, mask-free scoring against a forward of each row alone, without padding."""
    from hflow.engine.logprobs import response_log_probs
    from hflow.engine.models import load_causal_lm

    model = load_causal_lm(str(tiny_model), torch.float32)
    b = _batch()
    b.tensors["input_ids"] = torch.randint(3, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    b.tensors["responses"] = b["input_ids"][:, 4:]
    with torch.no_grad():
        log_probs, entropy = response_log_probs(model, b, 0.7, with_entropy=True)
        for row in range(2):
            mask = b["attention_mask"][row].bool()
            ids = b["input_ids"][row][mask][None]
            n_resp = int(b["response_mask"][row].sum())
            logits = model(input_ids=ids).logits[0, -n_resp - 1:-1] / 0.7
            ref = torch.log_softmax(logits, -1)
            want = ref.gather(-1, ids[0, -n_resp:, None]).squeeze(-1)
            torch.testing.assert_close(log_probs[row, :n_resp], want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(entropy[row, :n_resp], -(ref.exp() * ref).sum(-1), rtol=1e-5, atol=1e-5)
