"""Rows packed into one sequence (engine/training/packed.py): the same log-probs and gradients as
every row run alone (the slow reference), for grouped-query attention and biased projections too,
through activation checkpointing's recomputation; no token of padding through the model; and a
model switched to packed attention still runs every other forward as SDPA. Each test runs twice:
the grids' attention through the compiled kernel (engine/kernels/grid_attention.c, where it can be
built) and through torch's."""

import pytest
import torch

from hflow.engine import work_meter
from hflow.engine.groups.batch import Batch
from hflow.engine.kernels import grid_attention
from hflow.engine.rollout.assembly import assemble_rollout
from hflow.engine.training import logprobs, packed

VOCAB = 61


@pytest.fixture(autouse=True, params=["kernel", "torch"])
def grid_kernel(request, monkeypatch):
    """The grids' attention through the compiled kernel, counting its calls (None where it cannot be
    built here), or through torch's SDPA."""
    if request.param == "torch":
        monkeypatch.setattr(grid_attention, "available", lambda: None)
        return None
    if grid_attention.available() is None:
        pytest.skip("the grid attention kernel cannot be built here")
    calls = []
    real = grid_attention.attention
    monkeypatch.setattr(grid_attention, "attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _model(kind: str):
    """A small random model: Llama with grouped-query attention (4 query heads on 2 key-value
    heads, as SmolLM2's 9 on 3), or Qwen2 with its biased q, k, v projections; heads of 16 (the
    grid kernel's vectors)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape, attn_implementation="sdpa"))
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation="sdpa"))
    return model.float()


def _batch(share: bool, prefix: int = 0) -> Batch:
    """3 prompts of 2-6 tokens, each sampled 3 times (share) or once, responses of 1-9 tokens; with
    `prefix`, all three begin with the same `prefix` tokens (a chat template's header, say)."""
    g = torch.Generator().manual_seed(3)
    head = torch.randint(3, VOCAB, (prefix,), generator=g).tolist()
    prompts = [head + torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (6, 2, 4)]
    rows = [p for p in prompts for _ in range(3 if share else 1)]
    lengths = torch.tensor([9, 1, 5, 7, 3, 9, 2, 6, 4][:len(rows)])
    out = assemble_rollout(rows, torch.randint(3, VOCAB, (len(rows), 9), generator=g), lengths, 0)
    batch = Batch(out)
    batch.meta["share_prompts"] = share
    return batch


def _alone(model, batch: Batch) -> torch.Tensor:
    """(B, R) log-probs of each row run alone and unpadded, zero past its response."""
    out = torch.zeros(batch["responses"].shape)
    for row in range(len(batch)):
        ids = batch["input_ids"][row][batch["attention_mask"][row].bool()][None]
        n = int(batch["response_mask"][row].sum())
        logits = model(input_ids=ids).logits[0, -n - 1:-1].float()
        out[row, :n] = torch.log_softmax(logits, -1).gather(-1, ids[0, -n:, None])[:, 0]
    return out


def _grads(model, log_probs: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    return torch.autograd.grad((log_probs * weights).sum(), [p for p in model.parameters() if p.requires_grad])


def _assert_same_grads(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * max(1.0, float(b.abs().max())))


def _alone_then_checkpointed(model, batch: Batch, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(random weights of the scored tokens, the gradients of each row alone under them); the model
    is then put in training mode with activation checkpointing."""
    weights = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(seed))
    weights *= batch["response_mask"]
    want = _grads(model, _alone(model, batch), weights)
    model.gradient_checkpointing_enable()
    model.train()
    return weights, want


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("share", [True, False])
def test_packed_rows_score_as_each_row_alone(kind, share, grid_kernel):
    model = _model(kind)
    batch = _batch(share)
    assert packed.can_pack(model) and logprobs.shares_prompts(model, batch) == share
    mask = batch["response_mask"].float()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    want = _alone(model, batch) * mask
    got, _ = logprobs.response_log_probs(model, batch, 1.0)
    assert model.config._attn_implementation == packed.PACKED  # the packed path ran
    torch.testing.assert_close(got * mask, want, rtol=1e-5, atol=1e-5)
    _assert_same_grads(_grads(model, got, weights), _grads(model, want, weights))
    if grid_kernel is not None:  # each layer's grids through the kernel: the prompts' and the rows'
        assert len(grid_kernel) == model.config.num_hidden_layers * (2 if share else 1)


def test_a_prefix_every_prompt_begins_with_runs_once_and_scores_as_each_row_alone(monkeypatch):
    """Prompts that begin with the same 20 tokens: the packed pass runs those tokens once, before
    every prompt's rest, and each row's log-probs and the gradients are those of the row alone."""
    model = _model("llama")
    batch = _batch(True, prefix=20)
    heads = []
    layout = packed.PackedRows.__post_init__
    monkeypatch.setattr(packed.PackedRows, "__post_init__", lambda self: heads.append(self.prefix) or layout(self))
    mask = batch["response_mask"].float()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(6)) * mask
    want = _alone(model, batch) * mask
    got, _ = logprobs.response_log_probs(model, batch, 1.0)
    assert heads == [20]
    torch.testing.assert_close(got * mask, want, rtol=1e-5, atol=1e-5)
    _assert_same_grads(_grads(model, got, weights), _grads(model, want, weights))


def test_prompts_sampled_once_share_their_prefix_too(monkeypatch):
    """One sample per prompt (PPO's n = 1): no prompt repeats, but the three begin alike, so the
    packed pass still runs their prefix once, with each row's own log-probs."""
    model = _model("llama")
    batch = _batch(False, prefix=20)
    assert logprobs.shares_prompts(model, Batch(batch.tensors, batch.columns, {}))
    heads = []
    layout = packed.PackedRows.__post_init__
    monkeypatch.setattr(packed.PackedRows, "__post_init__", lambda self: heads.append(self.prefix) or layout(self))
    mask = batch["response_mask"].float()
    got, _ = logprobs.response_log_probs(model, Batch(batch.tensors, batch.columns, {}), 1.0)
    assert heads == [20]
    torch.testing.assert_close(got * mask, _alone(model, batch) * mask, rtol=1e-5, atol=1e-5)


def test_a_shared_prefix_counts_once_in_the_meter():
    """The meter counts the prefix's 20 tokens once, each prompt's rest, and the keys the three
    grids computed: the prefix causally, the prompts' rests after it, the rows after both."""
    model = _model("llama")
    batch = _batch(True, prefix=20)
    work_meter.attach(model, "actor")
    work_meter.take()
    with torch.no_grad():
        logprobs.response_log_probs(model, batch, 1.0)
    counted = work_meter.take()["other"]["actor"]
    lengths = batch["response_mask"].sum(-1)
    assert counted["tokens"] == 20 + (6 + 2 + 4) + int((lengths - 1).sum())
    widest = int(lengths.max()) - 1
    assert counted["keys"] == (work_meter.causal_keys(1, 20, 0) + work_meter.causal_keys(3, 6, 20)
                               + work_meter.causal_keys(len(batch), widest, 26))


@pytest.mark.parametrize("micro", [3, 2, 4])
def test_a_prefix_held_across_micro_batches_runs_once_and_scores_as_each_row_alone(micro):
    """Scoring without gradients in micro-batches of 3 rows (one prompt group each), 2 or 4 (groups
    cut between micro-batches): the 20 tokens every prompt begins with run in the first packed
    forward only, the others attend to their keys; each row's log-probs are its own alone."""
    model = _model("llama")
    batch = _batch(True, prefix=20)
    work_meter.attach(model, "actor")
    work_meter.take()
    got, _ = logprobs.batched_log_probs(model, batch, 1.0, micro)
    counted = work_meter.take()["other"]["actor"]
    mask = batch["response_mask"].float()
    with torch.no_grad():
        want = _alone(model, batch) * mask
    torch.testing.assert_close(got * mask, want, rtol=1e-5, atol=1e-5)
    lengths = batch["response_mask"].sum(-1)
    prompt_rests = torch.tensor([6, 6, 6, 2, 2, 2, 4, 4, 4])  # each row's prompt after the prefix
    runs = [(prompt_rests[i:i + micro].unique_consecutive(), lengths[i:i + micro]) for i in range(0, 9, micro)]
    # The prefix once; each micro-batch's prompt rests (a group cut in two runs its prompt twice).
    assert counted["tokens"] == 20 + sum(int(p.sum()) for p, _ in runs) + int((lengths - 1).sum())
    assert counted["keys"] == work_meter.causal_keys(1, 20, 0) + sum(
        work_meter.causal_keys(len(p), int(p.max()), 20) + work_meter.causal_keys(len(n), int(n.max()) - 1,
                                                                                  20 + int(p.max()))
        for p, n in runs)


def _held_through_micro_batches(model, batch: Batch, micro: int, weights: torch.Tensor) -> packed.HeldPrefix:
    """An update's micro-batches of `micro` rows, each with its backward, all attending to one
    prefix held with gradients: the parameters' .grad then hold the whole batch's."""
    micros = batch.split(micro)
    held = packed.held_prefix(*logprobs.group_prompts(batch, logprobs.prompt_groups(batch)), uses=len(micros))
    for i, part in enumerate(micros):
        log_probs, _ = logprobs.response_log_probs(model, part, 1.0, held=held)
        (log_probs * weights[i * micro:(i + 1) * micro]).sum().backward()
    return held


@pytest.mark.parametrize("micro, checkpointing", [(3, False), (2, False), (4, False), (2, True)])
def test_a_prefix_held_through_an_update_s_micro_batches_runs_once_with_each_row_s_own_gradients(micro,
                                                                                              checkpointing):
    """An update in micro-batches of 3 rows, 2 or 4 (prompt groups cut between them), with
    activation checkpointing too: the 20 tokens every prompt begins with run once, forward and
    backward, and the gradients gathered over the micro-batches are those of every row alone."""
    model = _model("llama")
    batch = _batch(True, prefix=20)
    mask = batch["response_mask"].float()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(4)) * mask
    want = _grads(model, _alone(model, batch), weights)
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.train()
    work_meter.attach(model, "actor")
    work_meter.take()
    held = _held_through_micro_batches(model, batch, micro, weights)
    counted = work_meter.take()["other"]["actor"]
    assert held.flowed
    _assert_same_grads([p.grad for p in model.parameters()], want)
    lengths = batch["response_mask"].sum(-1)
    prompt_rests = torch.tensor([6, 6, 6, 2, 2, 2, 4, 4, 4])
    runs = [prompt_rests[i:i + micro].unique_consecutive() for i in range(0, 9, micro)]
    tokens = 20 + sum(int(p.sum()) for p in runs) + int((lengths - 1).sum())  # the prefix once
    assert counted["backward_tokens"] == tokens
    assert counted["tokens"] == tokens * (2 if checkpointing else 1)


def test_a_prefix_held_with_gradients_is_attended_to_as_often_as_its_uses():
    model = _model("llama")
    batch = _batch(True, prefix=20)
    prompts = logprobs.group_prompts(batch, logprobs.prompt_groups(batch))
    with torch.no_grad(), pytest.raises(ValueError, match="for passes with them"):
        logprobs.response_log_probs(model, batch, 1.0, held=packed.held_prefix(*prompts, uses=2))
    held = packed.held_prefix(*prompts, uses=1)
    logprobs.response_log_probs(model, batch, 1.0, held=held)
    with pytest.raises(ValueError, match="more often than its uses"):
        logprobs.response_log_probs(model, batch, 1.0, held=held)
    with pytest.raises(ValueError, match="at least one forward"):
        packed.HeldPrefix(prompts[0][0, :20], uses=0)


def test_a_held_prefix_is_for_passes_without_gradients_and_for_prompts_that_begin_with_it():
    model = _model("llama")
    batch = _batch(True, prefix=20)
    width = batch["attention_mask"].shape[1] - batch["responses"].shape[1]
    ids, mask = batch["input_ids"][0, :width], batch["attention_mask"][0, :width].bool()
    with pytest.raises(ValueError, match="without them"):
        logprobs.response_log_probs(model, batch, 1.0, held=packed.HeldPrefix(ids[mask][:20]))
    other = ids[mask][:20].clone()
    other[3] = (other[3] + 1) % VOCAB
    with torch.no_grad(), pytest.raises(ValueError, match="do not all begin"):
        logprobs.response_log_probs(model, batch, 1.0, held=packed.HeldPrefix(other))


def test_a_short_common_prefix_is_not_split_off():
    """Two shared tokens save less than the prefix's own attention call costs: no prefix."""
    def prefix_of(batch):
        first = torch.tensor([0, 3, 6])  # each prompt's first row
        width = batch["attention_mask"].shape[1] - batch["responses"].shape[1]
        return packed.shared_prefix(batch["input_ids"][first, :width], batch["attention_mask"][first, :width])

    assert prefix_of(_batch(True, prefix=2)) == 0
    assert prefix_of(_batch(True, prefix=20)) == 20


@pytest.mark.parametrize("share, prefix", [(True, 0), (False, 0), (True, 20)])
def test_checkpointing_recomputes_the_packed_attention_in_the_backward(share, prefix):
    """With activation checkpointing each layer runs again during the backward, after the forward
    that packed it has returned: the layout travels with the attention mask, so the recomputation
    attends within rows too (and after a shared prefix). Packed, shared prompts need no KV cache:
    they are shared under checkpointing too."""
    model = _model("llama")
    batch = _batch(share, prefix)
    weights, want = _alone_then_checkpointed(model, batch, 2)
    assert logprobs.shares_prompts(model, batch) == share
    calls = []
    original = packed.PackedRows.attend
    packed.PackedRows.attend = lambda self, *args: calls.append(1) or original(self, *args)
    try:
        got = _grads(model, logprobs.response_log_probs(model, batch, 1.0)[0], weights)
    finally:
        packed.PackedRows.attend = original
    assert len(calls) == 2 * model.config.num_hidden_layers  # each layer: the forward, then its recomputation
    _assert_same_grads(got, want)


def test_only_a_model_that_packs_shares_prompts_under_checkpointing():
    """Unpacked, a shared prompt's KV cache would have to carry gradients into its rows' pass, and
    checkpointing turns the cache off while training: such a model scores its rows whole, with the
    right gradients. A model that packs shares (no cache), unless ZeRO-3 ranks run in lockstep."""
    model = _model("llama")
    model.config._attn_implementation = "eager"
    batch = _batch(True)
    weights, want = _alone_then_checkpointed(model, batch, 4)
    assert not logprobs.can_share_prompts(model) and not logprobs.shares_prompts(model, batch)
    _assert_same_grads(_grads(model, logprobs.response_log_probs(model, batch, 1.0)[0], weights), want)
    model.config._attn_implementation = "sdpa"
    assert logprobs.can_share_prompts(model) and not logprobs.can_share_prompts(model, lockstep=True)


def test_no_padding_goes_through_the_model():
    """The body runs each prompt's own tokens once and each response up to its last scored token's
    predecessor, all in one forward: the meter counts exactly those tokens, the attention keys the
    two packed grids computed, and a head position per prompt and per scored token."""
    model = _model("llama")
    batch = _batch(True)
    meter = work_meter.attach(model, "actor")
    work_meter.take()
    with torch.no_grad():
        logprobs.response_log_probs(model, batch, 1.0)
    counted = work_meter.take()["other"]["actor"]
    assert meter is not None
    lengths = batch["response_mask"].sum(-1)
    prompts = 6 + 2 + 4  # three prompt groups, each run once, unpadded
    assert counted["tokens"] == prompts + int((lengths - 1).sum())
    widest = int(lengths.max()) - 1
    assert counted["keys"] == work_meter.causal_keys(3, 6, 0) + work_meter.causal_keys(len(batch), widest, 6)
    assert counted["logits"] == 3 + int((lengths - 1).sum())


def test_a_model_switched_to_packed_attention_runs_other_forwards_as_sdpa():
    """After a packed call the model's attention implementation is `hflow_packed`; a forward that is
    not packed (generation's left-padded prefill, perhaps on another thread) gets SDPA's."""
    model = _model("llama")
    batch = _batch(True)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  position_ids=batch["position_ids"])
    with torch.no_grad():
        before = model(**kwargs).logits
        logprobs.response_log_probs(model, batch, 1.0)
        assert model.config._attn_implementation == packed.PACKED
        after = model(**kwargs).logits
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_only_full_attention_models_on_sdpa_pack():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    assert not packed.can_pack(Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, use_sliding_window=True, sliding_window=4, attn_implementation="sdpa")))
    eager = _model("llama")
    eager.config._attn_implementation = "eager"
    assert not packed.can_pack(eager)


def test_a_bfloat16_model_s_packed_attention_runs_in_float32_on_the_cpu(monkeypatch, grid_kernel):
    """torch's CPU attention kernels are slower in bfloat16 than in float32: a bfloat16 model's grids
    attend in float32 (torch's or the grid kernel, which takes float32 only), and the layer goes on
    in bfloat16. Its log-probs are the float32 model's within bfloat16's rounding of the same
    weights, and its gradients arrive in bfloat16."""
    model = _model("llama")
    want = _alone(model, _batch(True))
    model = model.to(torch.bfloat16)
    batch = _batch(True)
    seen = []
    sdpa = packed.F.scaled_dot_product_attention
    monkeypatch.setattr(packed.F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: seen.append(q.dtype) or sdpa(q, k, v, **kw))
    if grid_kernel is not None:
        kernel = grid_attention.attention
        monkeypatch.setattr(grid_attention, "attention", lambda kern, q, *a, **k: seen.append(q.dtype) or
                            kernel(kern, q, *a, **k))
    got, _ = logprobs.response_log_probs(model, batch, 1.0)
    assert model.config._attn_implementation == packed.PACKED
    assert seen == [torch.float32] * (2 * model.config.num_hidden_layers)  # a layer: prompts, then rows
    mask = batch["response_mask"].float()
    torch.testing.assert_close(got.float() * mask, want * mask, rtol=0, atol=0.1)
    grads = _grads(model, got, torch.randn(mask.shape, generator=torch.Generator().manual_seed(5)) * mask)
    assert all(g.dtype == torch.bfloat16 and g.abs().sum() > 0 for g in grads)
