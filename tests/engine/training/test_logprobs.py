"""Log-probs from vocabulary-sized logits in bounded memory (engine/training/token_logprobs.py,
engine/training/logprobs.py): the same values and gradients as the straightforward log-softmax
(the slow reference, kept here), and a peak of temporaries that is a chunk's, not the logits'."""

import types

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.training import logprobs, token_logprobs
from hflow.engine.training.token_logprobs import token_log_probs
from peak_memory import PeakAllocated


def reference(logits: torch.Tensor, tokens: torch.Tensor, temperature: float):
    """The straightforward way (what logprobs.py did before): log_softmax over the whole
    float32 logits / T; entropy from its exp. logits (..., V), tokens (...)."""
    log_softmax = torch.log_softmax(logits.float() / temperature, dim=-1)
    log_probs = log_softmax.gather(-1, tokens[..., None]).squeeze(-1)
    return log_probs, -(log_softmax.exp() * log_softmax).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_log_probs_equal_log_softmax_values_and_gradients(temperature, with_entropy):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 7, 50, generator=g)).requires_grad_()
    rows = torch.tensor([[0, 0, 1, 2], [2, 1, 1, 0]])
    columns = torch.tensor([[6, 6, 0, 3], [1, 2, 2, 5]])  # (0, 6) and (1, 2) twice: both gradients add
    tokens = torch.randint(0, 50, rows.shape, generator=g)
    weights = torch.randn(2, *rows.shape, generator=g)  # d(loss)/d(log-prob), d(loss)/d(entropy)

    got, got_entropy = token_log_probs(logits, (rows, columns), tokens, temperature, with_entropy,
                                       chunk_values=3 * 50)  # 3 tokens a chunk: 3 chunks
    loss = (got * weights[0]).sum() + ((got_entropy * weights[1]).sum() if with_entropy else 0)
    got_grad, = torch.autograd.grad(loss, logits)

    want, want_entropy = reference(logits[rows, columns], tokens, temperature)
    loss = (want * weights[0]).sum() + ((want_entropy * weights[1]).sum() if with_entropy else 0)
    want_grad, = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if with_entropy:
        torch.testing.assert_close(got_entropy, want_entropy, rtol=1e-5, atol=1e-6)
    else:
        assert got_entropy is None
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("temperature, dtype", [(1.0, torch.float32), (0.7, torch.float32), (1.0, torch.bfloat16)])
def test_every_row_scored_equals_the_reference_and_leaves_the_logits_untouched(temperature, dtype):
    """`where=()`: logits (K, V) from a head run only where scored, each row once, in chunks of
    slices (not copies by indexing); float32 logits must not be changed in place by the chunks."""
    g = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(10, 50, generator=g)).to(dtype).requires_grad_()
    before = logits.detach().clone()
    tokens = torch.randint(0, 50, (10,), generator=g)
    weights = torch.randn(2, 10, generator=g)
    got, got_entropy = token_log_probs(logits, (), tokens, temperature, True, chunk_values=3 * 50)
    got_grad, = torch.autograd.grad((got * weights[0]).sum() + (got_entropy * weights[1]).sum(), logits)
    want, want_entropy = reference(logits, tokens, temperature)
    want_grad, = torch.autograd.grad((want * weights[0]).sum() + (want_entropy * weights[1]).sum(), logits)
    assert torch.equal(logits.detach(), before)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_entropy, want_entropy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_rows_scored_twice_or_not_at_all_get_their_gradients_added_or_zero(with_entropy):
    """`where=(rows,)`: a shared prompt's last logits scored by each of its samples (row 0 three
    times, row 1 twice), row 2 never, then rows scored once each, in chunks that mix the kinds (3
    tokens a chunk): the gradient of a twice-scored row is the sum, of an unscored one zero, and the
    rows scored once are written without a zeroed copy of all the logits first."""
    g = torch.Generator().manual_seed(5)
    logits = (3 * torch.randn(7, 50, generator=g)).requires_grad_()
    rows = torch.tensor([0, 0, 1, 0, 1, 3, 4, 5, 6])
    tokens = torch.randint(0, 50, rows.shape, generator=g)
    weights = torch.randn(2, len(rows), generator=g)
    got, got_entropy = token_log_probs(logits, (rows,), tokens, 1.0, with_entropy, chunk_values=3 * 50)
    loss = (got * weights[0]).sum() + ((got_entropy * weights[1]).sum() if with_entropy else 0)
    got_grad, = torch.autograd.grad(loss, logits)
    want, want_entropy = reference(logits[rows], tokens, 1.0)
    loss = (want * weights[0]).sum() + ((want_entropy * weights[1]).sum() if with_entropy else 0)
    want_grad, = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)
    assert torch.equal(got_grad[2], torch.zeros(50))


def test_log_probs_of_a_hand_computed_distribution():
    """Logits log(1, 2, 5) at T = 1: p = (1/8, 2/8, 5/8); token 1 has log(1/4); at T = 0.5 the
    logits double: p is proportional to (1, 4, 25)."""
    logits = torch.log(torch.tensor([[1.0, 2.0, 5.0]]))
    index = (torch.tensor([0]),)
    log_p, entropy = token_log_probs(logits, index, torch.tensor([1]), 1.0, with_entropy=True)
    p = torch.tensor([1, 2, 5]) / 8
    torch.testing.assert_close(log_p, torch.log(torch.tensor([0.25])))
    torch.testing.assert_close(entropy, -(p * p.log()).sum()[None])
    log_p, _ = token_log_probs(logits, index, torch.tensor([2]), 0.5)
    torch.testing.assert_close(log_p, torch.log(torch.tensor([25 / 30])))


def _rollout(tiny_model):
    """The tiny model and a rollout of 3 prompts (two sampled 3 times, one once), 12 new tokens."""
    from hflow.engine.models.loading import load_causal_lm, load_tokenizer
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams

    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32)
    engine = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, 64)
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ["write digits: ", "a longer prompt: ", "q: "]]
    out = engine.generate(prompts, 3, SamplingParams(12), torch.Generator().manual_seed(4))
    return model, Batch(out).index([0, 1, 2, 3, 4, 5, 6])  # the last prompt once


def reference_rows(model, batch: Batch, temperature: float):
    """Each row run alone, unpadded, scored the straightforward way: (B, R) log-probs and entropy,
    zero past each response."""
    log_probs = torch.zeros(batch["responses"].shape)
    entropy = torch.zeros(batch["responses"].shape)
    for row in range(len(batch)):
        ids = batch["input_ids"][row][batch["attention_mask"][row].bool()][None]
        n = int(batch["response_mask"][row].sum())
        lp, ent = reference(model(input_ids=ids).logits[0, -n - 1:-1], ids[0, -n:], temperature)
        log_probs[row, :n], entropy[row, :n] = lp, ent
    return log_probs, entropy


@pytest.mark.parametrize("share, overhead, head_at, pack", [
    (True, 0, True, True), (False, 0, True, True),  # rows packed into one sequence (`packed.py`)
    (True, 10**6, True, False), (True, 0, True, False), (True, 0, False, False),
    (False, 0, True, False), (False, 0, False, False)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("holes", [False, True])
def test_response_log_probs_equal_the_reference_values_and_gradients(tiny_model, monkeypatch, share, overhead,
                                                                     head_at, pack, temperature, holes):
    """Rows packed into one forward; or shared prompts in one bucket (a huge per-forward cost) or
    one per response length (none); the LM head on scored positions only or on whole columns; with
    `holes`, unscored tokens inside the responses (a tool's output in a multi-turn episode) and a
    row scored on its first token only."""
    monkeypatch.setattr(token_logprobs, "CPU_CHUNK_VALUES", 4 * 55)  # tiny vocabulary: chunks of 4 tokens
    monkeypatch.setitem(logprobs.BUCKET_OVERHEAD_TOKENS, "cpu", overhead)
    if not pack:
        monkeypatch.setattr(logprobs, "can_pack", lambda forward: False)
    if not head_at:
        monkeypatch.setattr(logprobs, "can_head_at", lambda forward: False)
    model, batch = _rollout(tiny_model)
    want = reference_rows(model, batch, temperature)  # before any holes: every response token
    if holes:
        batch["response_mask"][1, 2:5] = 0
        batch["response_mask"][3, 1:] = 0
    batch.meta["share_prompts"] = share
    assert logprobs.shares_prompts(model, batch) == share
    mask = batch["response_mask"].float()
    want = tuple(w * mask for w in want)
    weights = torch.randn(2, *mask.shape, generator=torch.Generator().manual_seed(1)) * mask

    def loss_and_grads(log_probs, entropy):
        loss = (log_probs * weights[0]).sum() + (entropy * weights[1]).sum()
        return torch.autograd.grad(loss, list(model.parameters()))

    got = logprobs.response_log_probs(model, batch, temperature, with_entropy=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a * mask, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(loss_and_grads(*got), loss_and_grads(*want)):
        # float32 sums round relative to their terms, not their result: a near-zero element of the
        # embedding's gradient (largest elements about 14) differs by up to 4e-6 between two
        # summation orders (buckets and a shared prompt against each row alone; seen with another
        # rollout of the same test).
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * max(1.0, float(b.abs().max())))
    without, none = logprobs.response_log_probs(model, batch, temperature)
    assert none is None
    torch.testing.assert_close(without, got[0].detach())


@pytest.mark.parametrize("pack", [True, False])
def test_lm_head_runs_only_where_a_token_is_scored(tiny_model, monkeypatch, pack):
    """Computed = needed for the head: one position per scored token (and per prompt's last
    position, which scores its rows' first token), whatever the rows' lengths and holes."""
    monkeypatch.setitem(logprobs.BUCKET_OVERHEAD_TOKENS, "cpu", 0)
    if not pack:
        monkeypatch.setattr(logprobs, "can_pack", lambda forward: False)
    model, batch = _rollout(tiny_model)
    batch["response_mask"][1, 2:5] = 0
    positions = []
    handle = model.lm_head.register_forward_hook(lambda m, args, out: positions.append(args[0].numel() // model.config.hidden_size))
    scored_after_first = int(batch["response_mask"][:, 1:].sum())
    for share, head_runs in [(True, 3 + scored_after_first), (False, int(batch["response_mask"].sum()))]:
        batch.meta["share_prompts"] = share
        positions.clear()
        logprobs.response_log_probs(model, batch, 1.0)
        assert sum(positions) == head_runs
    handle.remove()


@pytest.mark.parametrize("overhead, expected", [
    (0, [([0, 2, 5], 1), ([1, 3], 10)]),           # every distinct width its own forward
    (15, [([0, 2, 5], 1), ([1, 3], 10)]),          # 3 x 9 padding saved > 15: still cut
    (30, [([0, 2, 5, 1, 3], 10)]),                 # 27 < 30: one forward
])
def test_length_buckets_cut_where_the_padding_saved_outweighs_a_forward(overhead, expected, monkeypatch):
    monkeypatch.setitem(logprobs.BUCKET_OVERHEAD_TOKENS, "cpu", overhead)
    buckets = logprobs.length_buckets(torch.tensor([1, 10, 1, 10, 0, 1]), "cpu")  # row 4 needs nothing
    assert [(sorted(rows.tolist()), width) for rows, width in buckets] == [(sorted(r), w) for r, w in expected]


def test_ptx_loss_equals_the_reference_and_its_gradient(tiny_model, monkeypatch):
    from hflow.engine import columns as col
    from hflow.engine.models.loading import load_causal_lm

    monkeypatch.setattr(token_logprobs, "CPU_CHUNK_VALUES", 5 * 55)
    model = load_causal_lm(str(tiny_model), torch.float32)
    ids = torch.randint(3, 55, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = (torch.arange(9)[None] < torch.tensor([[9], [5], [2]])).long()
    batch = Batch({col.PTX_INPUT_IDS: ids, col.PTX_ATTENTION_MASK: mask})
    got = logprobs.ptx_loss(model, batch, rows=4)
    logits = model(input_ids=ids, attention_mask=mask).logits
    nll = -reference(logits[:, :-1], ids[:, 1:], 1.0)[0] * mask[:, 1:]
    want = (nll.sum(-1) / mask[:, 1:].sum(-1)).sum() / 4
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, list(model.parameters())),
                    torch.autograd.grad(want, list(model.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


class LMHead(torch.nn.Module):
    """Stands in for a causal LM: returns the same precomputed logits (B, K, V) for any input, as
    a model's LM head would with `logits_to_keep=K` (the K columns `response_log_probs` asks for)."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                logits_to_keep=0):
        width = input_ids.shape[1]  # the last K positions, by index (`lm_head.logits_kwargs`)
        assert logits_to_keep.tolist() == list(range(width - self.logits.shape[1], width))
        return types.SimpleNamespace(logits=self.logits, past_key_values=None)


B, P, R, V = 8, 16, 64, 4096  # rows, prompt, response, vocabulary: (B, R, V) float32 is 8 MiB
FULL = B * R * V * 4


def _rows(requires_grad: bool, dtype=torch.float32):
    """Whole rows (prompts all of length P): scored from logits columns P - 1 .. P + R - 2 (the
    last token's column predicts nothing and is not run)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (B, P + R), generator=g)
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones(B, P + R, dtype=torch.long),
                   "responses": ids[:, P:], "response_mask": torch.ones(B, R, dtype=torch.long)},
                  meta={"share_prompts": False})
    logits = torch.randn(B, R, V, generator=g).to(dtype).requires_grad_(requires_grad)
    return LMHead(logits), batch


@pytest.mark.parametrize("temperature, with_entropy", [(1.0, False), (0.7, True)])
def test_peak_temporary_memory_is_a_chunk_not_the_logits(monkeypatch, tmp_path, temperature, with_entropy):
    """The CPU allocator's own peak (bytes, not time) of everything `response_log_probs` allocates
    past the model's logits: a few 16-token chunks (3% of (B, R, V) float32 each), where the
    reference allocates several copies of all of it."""
    monkeypatch.setattr(token_logprobs, "CPU_CHUNK_VALUES", 16 * V)
    head, batch = _rows(requires_grad=False)
    with torch.no_grad():
        with PeakAllocated(tmp_path) as chunked:
            logprobs.response_log_probs(head, batch, temperature, with_entropy)
        with PeakAllocated(tmp_path) as straightforward:
            reference(head.logits[:, :R], batch["responses"], temperature)
    print(f"(B, R, V) = {(B, R, V)}, float32 {FULL} bytes: peak temporary bytes {straightforward.peak} "
          f"straightforward, {chunked.peak} chunked")
    assert chunked.peak < 0.15 * FULL
    assert straightforward.peak >= 2 * FULL


def test_training_keeps_no_float32_copy_for_the_backward(monkeypatch, tmp_path):
    """With gradients the forward still allocates only chunks (the backward recomputes the softmax
    from the logits), and the backward allocates the logits' gradient and a chunk."""
    monkeypatch.setattr(token_logprobs, "CPU_CHUNK_VALUES", 16 * V)
    head, batch = _rows(requires_grad=True, dtype=torch.bfloat16)
    with PeakAllocated(tmp_path) as forward:
        log_probs, entropy = logprobs.response_log_probs(head, batch, 0.7, with_entropy=True)
        loss = log_probs.sum() + entropy.sum()
    with PeakAllocated(tmp_path) as backward:
        loss.backward()
    gradient = head.logits.numel() * head.logits.element_size()
    print(f"bfloat16 logits: forward peak {forward.peak}, backward peak {backward.peak} bytes "
          f"(gradient {gradient}, (B, R, V) float32 {FULL})")
    assert forward.peak < 0.15 * FULL
    assert backward.peak < gradient + 0.15 * FULL
