import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.training.packing import token_budget_groups, trim_padding


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


def test_trim_padding_keeps_a_multi_turn_response_s_untrained_environment_tokens():
    """A response whose last 2 real tokens are not trained (an environment's observation): its
    length is the attention mask's (5), not the trained-token count (3)."""
    b = _batch()
    b.tensors["attention_mask"][1, 4:] = 1
    b.tensors["response_mask"] = torch.tensor([[1, 0, 0, 0, 0], [1, 0, 1, 1, 0]])
    t = trim_padding(b)
    assert t["response_mask"].shape[1] == 5 and int(t["attention_mask"].sum()) == int(b["attention_mask"].sum())


def test_trimmed_log_probs_equal_untrimmed(tiny_model):
    from hflow.engine.training.logprobs import response_log_probs
    from hflow.engine.models.loading import load_causal_lm

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
    from hflow.engine.training.logprobs import response_log_probs
    from hflow.engine.models.loading import load_causal_lm

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


def _grouped_batch(tiny_model):
    """Three prompts (two of them sampled three times), left-padded; responses right-padded."""
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams
    from hflow.engine.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32)
    engine = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, 64)
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ["write digits: ", "a longer prompt: "]]
    out = engine.generate(prompts, 3, SamplingParams(12), torch.Generator().manual_seed(4))
    single = engine.generate([tok("say q: ", add_special_tokens=False).input_ids], 1, SamplingParams(12),
                             torch.Generator().manual_seed(5))
    from hflow.engine.padding import pad_rollout

    width_p = max(o["attention_mask"].shape[1] - o["response_mask"].shape[1] for o in (out, single))
    width_r = max(o["response_mask"].shape[1] for o in (out, single))
    parts = [Batch(pad_rollout(o, width_p, width_r, tok.pad_token_id)) for o in (out, single)]
    return model, Batch.concat(parts)


def test_shared_prompt_scoring_equals_each_row_alone_and_its_gradient(tiny_model):
    from hflow.engine.training import logprobs

    model, b = _grouped_batch(tiny_model)
    assert logprobs.prompt_groups(b).tolist() == [0, 0, 0, 1, 1, 1, 2]
    shared, entropy = logprobs.response_log_probs(model, b, 0.9, with_entropy=True)
    mask = b["response_mask"].bool()
    with torch.no_grad():
        for row in range(len(b)):
            ids = b["input_ids"][row][b["attention_mask"][row].bool()][None]
            n_resp = int(mask[row].sum())
            ref = torch.log_softmax(model(input_ids=ids).logits[0, -n_resp - 1:-1] / 0.9, -1)
            torch.testing.assert_close(shared[row, :n_resp], ref.gather(-1, ids[0, -n_resp:, None]).squeeze(-1),
                                       rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(entropy[row, :n_resp], -(ref.exp() * ref).sum(-1), rtol=1e-5, atol=1e-5)
    # The prompt pass gets the gradient of every row sharing it: the same as scoring rows whole.
    (shared * mask).sum().backward()
    with_sharing = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    b.meta["share_prompts"] = False
    whole, _ = logprobs.response_log_probs(model, b, 0.9)
    (whole * mask).sum().backward()
    for got, want in zip(with_sharing, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_prompt_group_cut_keeps_groups_together():
    from hflow.engine.training.packing import prompt_group_cut

    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    prompts = torch.tensor([50, 50, 50, 10, 10, 50, 50, 50])
    responses = torch.tensor([5, 9, 7, 2, 3, 40, 1, 1])
    # Units by longest response: 2 (3 rows, 50 + 40), 0 (3 rows, 50 + 9), 1 (2 rows, 10 + 3).
    # One micro-batch: 3 x 50 + 8 x 40 = 470 (+ 90 overhead) = 560; [2] [0, 1]: 50 + 120 + 2 x 50 + 5 x 9
    # = 315 (+ 180) = 495; [2] [0] [1]: 170 + 177 + 26 (+ 270) = 643; [2, 0] [1]: 100 + 240 + 26 (+ 180) = 546.
    rows, cost = prompt_group_cut(prompts, responses, groups, max_tokens=10_000, with_cost=True)
    assert rows == [[5, 6, 7], [0, 1, 2, 3, 4]] and cost == 495
    assert len(prompt_group_cut(prompts, responses, groups, max_tokens=10_000, min_groups=3)) == 3


def test_micro_batches_share_prompts_only_where_that_computes_less(tiny_model):
    from hflow.engine.training.packing import micro_batches

    _, b = _grouped_batch(tiny_model)
    micros = micro_batches(b, micro_batch_size=len(b), micro_batch_tokens=None, world_size=1, device="cpu",
                           share_prompts=True)
    assert sum(len(m) for m in micros) == len(b)
    assert all(m.meta["share_prompts"] for m in micros)  # three prompt groups of 14-17 tokens, short answers
    unshared = micro_batches(b, len(b), None, 1, "cpu", share_prompts=False)
    assert not any(m.meta["share_prompts"] for m in unshared)


def _uneven_groups() -> Batch:
    """Two prompts of 2 tokens, each sampled 4 times: one 30-token answer and three 1-token ones."""
    responses = torch.tensor([30, 1, 1, 1, 30, 1, 1, 1])
    response_mask = (torch.arange(30)[None] < responses[:, None]).long()
    attention = torch.cat([torch.ones(8, 2, dtype=torch.long), response_mask], 1)
    ids = torch.cat([torch.tensor([[5, 6]] * 4 + [[7, 8]] * 4), torch.full((8, 30), 9)], 1)
    return Batch({"input_ids": ids, "attention_mask": attention, "response_mask": response_mask,
                  "responses": ids[:, 2:]})


def test_micro_batches_cut_whole_rows_where_sharing_pads_more():
    from hflow.engine.training.packing import micro_batches

    # Shared: 2 x 2 + 8 x 30 (+ 32) = 276 at best; whole rows: 2 x 32 + 6 x 3 (+ 2 x 32) = 146.
    micros = micro_batches(_uneven_groups(), micro_batch_size=8, micro_batch_tokens=None, world_size=1, device="cpu",
                           share_prompts=True)
    assert not any(m.meta["share_prompts"] for m in micros)
    assert sorted(len(m) for m in micros) == [2, 6]


def test_packed_micro_batches_count_the_rows_own_tokens():
    """Packed rows compute no padding: sharing the prompts then always computes less (the same
    batch: 2 x 2 + 66 own response tokens (+ 32) = 102 against whole rows' 8 x 2 + 66 (+ 32) = 114),
    and the budget holds the rows' own tokens: 70 tokens fit a budget of 80, which 8 rows padded to
    the longest (8 x 32) do not."""
    from hflow.engine.training.packing import micro_batches, prompt_group_cut, token_budget_groups

    micros = micro_batches(_uneven_groups(), micro_batch_size=8, micro_batch_tokens=80, world_size=1,
                           device="cpu", share_prompts=True, packed=True)
    assert [len(m) for m in micros] == [8] and micros[0].meta["share_prompts"]
    lengths = torch.tensor([10, 3, 9, 4, 2, 30])
    groups, cost = token_budget_groups(lengths, 20, packed=True, with_cost=True)
    # The fewest groups within 20 own tokens (30 alone): 58 tokens and three overheads of 30.
    assert len(groups) == 3 and cost == 58 + 3 * 30
    assert [5] in groups and all(int(lengths[g].sum()) <= 20 for g in groups if g != [5])
    assert token_budget_groups(lengths, 30, packed=True) == [[5], [0, 2, 3, 1, 4]]
    groups = torch.tensor([0, 0, 1, 1])
    rows, cost = prompt_group_cut(torch.tensor([4, 4, 6, 6]), torch.tensor([3, 1, 2, 5]), groups, 20,
                                  packed=True, with_cost=True)
    assert rows == [[2, 3], [0, 1]] and cost == (6 + 7) + (4 + 4) + 2 * 11


def test_packed_micro_batches_share_a_prefix_of_prompts_sampled_once():
    """Four prompts sampled once each (no prompt repeats) that begin with the same 20 tokens: packed,
    the prompt-group cut costs the prefix once and each row's own tokens, 20 + 4 x (2 + 3) (+ 25)
    against whole rows' 4 x 25 (+ 25), so it is taken."""
    from hflow.engine.training.packing import micro_batches, prompt_group_cut

    head = list(range(10, 30))
    prompts = torch.tensor([head + [5, 6], head + [7, 8], head + [5, 9], head + [6, 6]])
    responses = torch.full((4, 3), 4)
    batch = Batch({"input_ids": torch.cat([prompts, responses], 1),
                   "attention_mask": torch.ones(4, 25, dtype=torch.long),
                   "response_mask": torch.ones(4, 3, dtype=torch.long), "responses": responses})
    micros = micro_batches(batch, micro_batch_size=4, micro_batch_tokens=None, world_size=1, device="cpu",
                           share_prompts=True, packed=True)
    assert [len(m) for m in micros] == [4] and micros[0].meta["share_prompts"]
    _, cost = prompt_group_cut(torch.full((4,), 22), torch.full((4,), 3), torch.arange(4), 1000, packed=True,
                               with_cost=True, prefix=20)
    assert cost == 20 + 4 * 5 + 25  # the prefix once, each row's own tokens, one longest row's overhead


def test_a_prefix_held_across_micro_batches_costs_the_cut_once():
    """Two prompt groups after the same 20 tokens, a budget that holds one group: the cut into two
    micro-batches costs the prefix once (the update holds it across them), each group's own
    tokens, and one longest row's overhead per micro-batch."""
    from hflow.engine.training.packing import prompt_group_cut

    rows, cost = prompt_group_cut(torch.full((4,), 22), torch.full((4,), 3), torch.tensor([0, 0, 1, 1]), 10,
                                  packed=True, with_cost=True, prefix=20)
    assert rows == [[0, 1], [2, 3]]
    assert cost == 20 + 2 * (2 + 2 * 3) + 2 * 25
