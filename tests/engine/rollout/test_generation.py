"""The hf engine against plain transformers: greedy tokens and per-token log-probs."""

import pytest
import torch

from hflow.engine.rollout.fast_decode import WEIGHT_LEFT_FROM_ROWS
from hflow.engine.rollout.generation import HFGenerator, SamplingParams, UniformDraws, filter_logits
from hflow.engine.models.loading import load_causal_lm, load_tokenizer


def _engine(tiny_model, batch_size=64):
    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32)
    return tok, model, HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, batch_size)


def test_greedy_matches_transformers_generate_and_forward(tiny_model):
    tok, model, engine = _engine(tiny_model, batch_size=4)  # 2 prompts per decoding chunk
    texts = ["write digits: ", "say q: ", "echo abc: ", "a much longer prompt than the others: "]
    prompts = [tok(t, add_special_tokens=False).input_ids for t in texts]
    out = engine.generate(prompts, 2, SamplingParams(max_new_tokens=12, greedy=True))
    for i, p in enumerate(prompts):
        ref = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        ref_resp = ref[0, len(p):]
        with torch.no_grad():
            ref_lp = torch.log_softmax(model(ref).logits[0, len(p) - 1:-1], -1)
        ref_lp = ref_lp.gather(-1, ref_resp[:, None]).squeeze(-1)
        for row in (2 * i, 2 * i + 1):  # both samples of a greedy group are the same
            mask = out["response_mask"][row].bool()
            assert out["responses"][row][mask].tolist() == ref_resp.tolist()
            torch.testing.assert_close(out["rollout_log_probs"][row][mask], ref_lp, atol=1e-5, rtol=1e-5)
    # the assembled sequence is the prompt, left-padded, followed by the response
    row = out["input_ids"][0][out["attention_mask"][0].bool()]
    assert row.tolist()[: len(prompts[0])] == prompts[0]


def test_sampling_is_reproducible_and_stops_at_eos(tiny_model):
    tok, _, engine = _engine(tiny_model)
    prompts = [tok("write digits: ", add_special_tokens=False).input_ids] * 3
    params = SamplingParams(max_new_tokens=40, temperature=1.0)
    a = engine.generate(prompts, 4, params, torch.Generator().manual_seed(7))
    b = engine.generate(prompts, 4, params, torch.Generator().manual_seed(7))
    assert torch.equal(a["responses"], b["responses"])
    lengths = a["response_mask"].sum(-1)
    for row, n in enumerate(lengths.tolist()):
        if n < 40:  # ended early: its last real token is EOS, nothing after it
            assert a["responses"][row, n - 1] == tok.eos_token_id
            assert (a["responses"][row, n:] == tok.pad_token_id).all()


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # top_p 0.7: 0.5 alone is below 0.7, so 0.3 stays; 0.15 is dropped (0.8 already reached)
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[False, False, True, True]]


@pytest.mark.parametrize("gpu_layout", [False, True])
def test_fast_decoding_step_matches_the_transformers_forward(tiny_model, cpu_products, gpu_layout, monkeypatch):
    """The lean decoding path against transformers' forward: same samples, same log-probs, with
    the BLAS's products and with oneDNN's, and in the layout a GPU decodes in (rows leaving the
    batch as they finish)."""
    from hflow.engine.rollout import fast_decode

    if gpu_layout:
        monkeypatch.setattr(fast_decode, "step_layout", lambda weight: "rows")
    tok, model, engine = _engine(tiny_model, batch_size=8)
    slow = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, 8, fast=False)
    assert engine.fast and not slow.fast
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ["write digits: ", "say q: ", "echo ab: "]]
    params = SamplingParams(max_new_tokens=40, temperature=0.9, top_k=20)
    a = engine.generate(prompts, 4, params, torch.Generator().manual_seed(5))
    b = slow.generate(prompts, 4, params, torch.Generator().manual_seed(5))
    assert torch.equal(a["responses"], b["responses"])
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], rtol=1e-5, atol=1e-5)


def _qwen2_steps_match_the_forward(dtype, rows: int, layout: str | None = None, thin: bool | None = None) -> None:
    """A Qwen2-shaped model (q/k/v biases, 2 key-value heads for 4 query heads, tied head) on
    left-padded prompts: each lean step's logits are the forward's (in bfloat16 within its
    rounding); `layout` (else the device's own) is the step's (`fast_decode.step_layout`), and where
    `thin` is given, whether its products are the thin products' kernel's."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hflow.engine.kernels.thin_products import ThinProducts
    from hflow.engine.padding import positions
    from hflow.engine.rollout.fast_decode import FastDecoder, supports
    from hflow.engine.rollout.generation import ForwardDecoder

    config = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    for name, param in model.named_parameters():  # biases are zero when built: make them count
        if name.endswith("bias"):
            param.data.normal_(0, 0.5)
    assert supports(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 8]]).repeat(rows // 2, 1)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]).repeat(rows // 2, 1)
    decoders = []
    with torch.no_grad():
        for kind in (FastDecoder, ForwardDecoder):
            cache = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True).past_key_values
            decoders.append(FastDecoder(model, cache, mask, 4) if kind is FastDecoder else ForwardDecoder(model, cache, mask))
        if layout is not None:
            assert decoders[0].layout == layout
        if thin is not None:
            assert isinstance(decoders[0].product, ThinProducts) == thin
        tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.05}
        for tokens in ([9, 10], [11, 12], [13, 14]):
            fast, slow = (d.step(torch.tensor(tokens * (rows // 2))) for d in decoders)
            assert fast.shape == slow.shape == (rows, 97) and fast.is_contiguous()
            torch.testing.assert_close(fast, slow, **tolerance)


@pytest.mark.parametrize("rows", [2, WEIGHT_LEFT_FROM_ROWS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_decoding_step_with_biases_and_grouped_keys_matches_the_forward(dtype, rows, monkeypatch, cpu_products):
    """A Qwen2-shaped model's lean steps give the forward's logits, in float32 and bfloat16, with
    the BLAS's products as `F.linear` (few rows) and as `weight @ x` (many, the head in vocabulary
    slices of 40, 40 and 17 rows), with oneDNN's (float32 where chosen; bfloat16 wherever oneDNN
    takes it, whatever the choice), and in float32 with the thin products' kernel."""
    from hflow.engine.rollout import fast_decode

    monkeypatch.setattr(fast_decode, "HEAD_SLICE_ROWS", 40)
    _qwen2_steps_match_the_forward(dtype, rows, thin=cpu_products == "thin" and dtype == torch.float32)


@pytest.mark.parametrize("rows", [2, WEIGHT_LEFT_FROM_ROWS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gpu_s_layout_decodes_as_the_forward_on_the_model_s_own_weights(dtype, rows, monkeypatch):
    """The layout a GPU decodes in ("rows": `F.linear` on the model's own weights, q/k/v and
    gate/up as separate products), run here on the CPU: the forward's logits, and the step reads
    the model's parameters themselves (no joined or reordered copy)."""
    from hflow.engine.rollout import fast_decode

    made = []
    monkeypatch.setattr(fast_decode, "step_layout", lambda weight: "rows")
    monkeypatch.setattr(fast_decode, "packed", lambda *a: made.append(a) or pytest.fail("weights reordered"))
    _qwen2_steps_match_the_forward(dtype, rows, layout="rows")
    assert not made


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_rows_step_rounds_its_norms_and_rotary_pass_where_transformers_rounds(dtype):
    """In 16-bit floats the rows step (a GPU's, and oneDNN's on a CPU) samples what the trainer then
    scores through transformers' modules: its RMSNorm and rotary pass give their results to the bit."""
    from types import SimpleNamespace

    from transformers.models.llama.modeling_llama import LlamaRMSNorm, rotate_half

    from hflow.engine.rollout.fast_decode import FastDecoder, _rms_norm

    g = torch.Generator().manual_seed(0)
    h = (torch.randn(32, 576, generator=g) * 3).to(dtype)
    norm = LlamaRMSNorm(576, eps=1e-5).to(dtype)
    norm.weight.data = torch.randn(576, generator=g).to(dtype)
    assert torch.equal(_rms_norm(h, norm.weight, 1e-5), norm(h))
    x = torch.randn(32, 12, 64, generator=g).to(dtype)
    angle = torch.rand(32, 1, 64, generator=g) * 6
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    signed_sin = torch.cat((-sin[..., :32], sin[..., 32:]), -1)  # as the step builds it
    rotated = FastDecoder._rotary(SimpleNamespace(head_dim=64), x, cos, signed_sin)
    assert torch.equal(rotated, x * cos + rotate_half(x) * sin)


def test_each_device_decodes_in_its_layout(monkeypatch):
    """A weight off the CPU (a GPU's; here a meta tensor) decodes as rows on its own weights; a CPU
    weight packed where oneDNN decodes it (`cpu_products.decodes_packed`), else as columns through
    the BLAS."""
    from hflow.engine.rollout import fast_decode

    assert fast_decode.step_layout(torch.empty(2, 2, device="meta")) == "rows"
    for packs, layout in ((True, "packed"), (False, "columns")):
        monkeypatch.setattr(fast_decode, "decodes_packed", lambda weight, packs=packs: packs)
        assert fast_decode.step_layout(torch.empty(2, 2)) == layout


def test_inverse_cdf_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    draws = UniformDraws(20000, steps=6, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))
    for step, scale in ((0, 1.0), (4, 3.0)):  # rows need not sum to one
        drawn = draws.sample((probs * scale).expand(20000, 5), step, None)
        freq = torch.bincount(drawn, minlength=5).double() / len(drawn)
        # 20,000 draws: the standard error of a frequency is at most 0.0036; allow 4 of them.
        torch.testing.assert_close(freq, probs.double(), atol=0.015, rtol=0)
        assert freq[4] == 0
    rows = torch.tensor([7, 19999, 3])
    grid = torch.rand(20000, 5)
    assert torch.equal(draws.sample(grid[rows], 4, rows), draws.sample(grid, 4, None)[rows])  # a row's draw is its own
    same_seed = UniformDraws(20000, steps=6, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"))
    assert torch.equal(same_seed.sample(grid[rows], 4, rows), draws.sample(grid[rows], 4, rows))


def test_inverse_cdf_never_draws_a_token_of_probability_zero():
    # Draws at both ends of (0, 1): u = 0 targets the whole mass, u near 1 the smallest
    # positive amount; masked tokens (zeros) before, between and after the allowed ones.
    probs = torch.tensor([[0.0, 0.0, 0.25, 0.0, 0.75, 0.0]]).expand(3, 6)
    draws = UniformDraws(3, steps=1, generator=None, device=torch.device("cpu"))
    draws.values = torch.tensor([[0.0, 1.0 - 2.0**-24, 0.5]])
    assert draws.sample(probs, 0, None).tolist() == [4, 2, 4]


class _Recorded(torch.nn.Module):
    """The tiny model behind a forward that records, per call, how many positions went in and how
    many positions of logits came out (and `logits_to_keep`, for a forward that takes it)."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.calls = model, []

    def _call(self, **kwargs):
        out = self.inner(**kwargs)
        keep = kwargs.get("logits_to_keep")
        self.calls.append({"positions": kwargs["input_ids"].shape[1], "logits": out.logits.shape[1],
                           "logits_to_keep": keep.tolist() if isinstance(keep, torch.Tensor) else keep})
        return out


class _TakesLogitsToKeep(_Recorded):
    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                logits_to_keep=0):
        return self._call(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=past_key_values, use_cache=use_cache, logits_to_keep=logits_to_keep)


class _AllLogits(_Recorded):
    """A forward without `logits_to_keep`: the LM head on every position, as the prefill was before."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None):
        return self._call(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=past_key_values, use_cache=use_cache)


def test_prefill_computes_the_last_position_s_logits_only(tiny_model):
    """The prompt's other positions' logits are never read: a model that takes `logits_to_keep` is
    asked for 1 (with Qwen2.5's vocabulary, 32 x 512-token prompts would make 5 GB of them in bf16).
    The samples are those of a model computing all the logits."""
    tok, model, _ = _engine(tiny_model)
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ["write digits: ", "say q: "]]
    params = SamplingParams(max_new_tokens=20, temperature=0.8)
    runs = {}
    for wrapper in (_TakesLogitsToKeep, _AllLogits):
        recorded = wrapper(model)
        engine = HFGenerator(recorded, [tok.eos_token_id], tok.pad_token_id, 64)
        runs[wrapper] = engine.generate(prompts, 3, params, torch.Generator().manual_seed(11)), recorded.calls
    (kept, kept_calls), (whole, whole_calls) = runs[_TakesLogitsToKeep], runs[_AllLogits]
    width = max(map(len, prompts))
    assert kept_calls[0] == {"positions": width, "logits": 1, "logits_to_keep": [width - 1]}
    assert whole_calls[0] == {"positions": width, "logits": width, "logits_to_keep": None}
    assert torch.equal(kept["responses"], whole["responses"])
    torch.testing.assert_close(kept["rollout_log_probs"], whole["rollout_log_probs"], rtol=1e-5, atol=1e-6)


def test_finished_rows_leave_a_cpu_batch_as_its_products_run_fastest(tiny_model, monkeypatch, cpu_products):
    """32 rows of which some end at every step. With the BLAS's products, from 12 rows up the lean
    step keeps its batch at a multiple of 8 rows (finished rows fed padding until enough have
    ended), below 12 only the live rows; with oneDNN's, only the live rows at every step. The
    samples and log-probs are the plain forward's, which drops rows a quarter at a time."""
    from hflow.engine.rollout.fast_decode import FastDecoder

    tok, model, engine = _engine(tiny_model, batch_size=64)
    eos = tok("aeiou", add_special_tokens=False).input_ids  # common letters: rows end at many lengths
    fast = HFGenerator(model, eos, tok.pad_token_id, 64)
    slow = HFGenerator(model, eos, tok.pad_token_id, 64, fast=False)
    fed = []
    step = FastDecoder.step
    monkeypatch.setattr(FastDecoder, "step", lambda self, tokens: fed.append(len(tokens)) or step(self, tokens))
    prompts = [tok(f"count {k}: ", add_special_tokens=False).input_ids for k in range(8)]
    params = SamplingParams(max_new_tokens=24)
    a = fast.generate(prompts, 4, params, torch.Generator().manual_seed(2))
    b = slow.generate(prompts, 4, params, torch.Generator().manual_seed(2))
    assert torch.equal(a["responses"], b["responses"])
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], rtol=1e-5, atol=1e-5)
    lengths = a["response_mask"].sum(-1)
    live = [int((lengths > t + 1).sum()) for t in range(len(fed))]  # rows not finished after token t + 1
    if cpu_products != "blas":  # oneDNN's packed weights or the thin products' panels: any row count
        assert fed == live and any(rows < 12 for rows in fed) and any(rows % 8 for rows in fed)
        return
    assert fed[0] == 32 and any(rows < 12 for rows in fed)
    for rows, unfinished in zip(fed, live):
        assert rows == (unfinished if unfinished < 12 else min(32, -(-unfinished // 8) * 8))
    assert any(rows > unfinished for rows, unfinished in zip(fed, live))  # some finished rows were kept


def test_a_call_s_own_batch_size_sets_its_decoding_chunks_and_not_its_tokens(tiny_model, monkeypatch):
    """SamplingParams.batch_size (an evaluation's eval.batch_size) decodes that many rows together
    instead of the generator's own batch, in whole prompt groups: greedy, the same tokens and
    log-probs either way."""
    tok, _, engine = _engine(tiny_model, batch_size=4)
    chunks = []
    chunk = engine._generate_chunk
    monkeypatch.setattr(engine, "_generate_chunk",
                        lambda prompts, *a: chunks.append(len(prompts)) or chunk(prompts, *a))
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ["write digits: ", "say q: ", "echo ab: ",
                                                                    "a longer prompt: ", "z: "]]
    got = {}
    for batch in (None, 6, 64):
        chunks.clear()
        got[batch] = engine.generate(prompts, 2, SamplingParams(max_new_tokens=10, greedy=True, batch_size=batch))
        got[batch]["chunks"] = list(chunks)
    assert [got[b]["chunks"] for b in (None, 6, 64)] == [[2, 2, 1], [3, 2], [5]]  # prompts of 2 rows each
    for batch in (6, 64):
        assert torch.equal(got[batch]["responses"], got[None]["responses"])
        torch.testing.assert_close(got[batch]["rollout_log_probs"], got[None]["rollout_log_probs"],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reordered", [True, False])
def test_bfloat16_decodes_on_reordered_weights_where_onednn_takes_bfloat16(tiny_model, reordered, monkeypatch):
    """In bfloat16 on a CPU the lean step multiplies on oneDNN's reordered weights where torch's
    oneDNN takes bf16 (AVX-512 and up), else as the BLAS's path does; either way its float32
    logits are the forward's within bf16's rounding."""
    from hflow.engine.kernels import cpu_products
    from hflow.engine.padding import positions
    from hflow.engine.rollout.fast_decode import FastDecoder
    from hflow.engine.rollout.generation import ForwardDecoder

    if reordered and not cpu_products._onednn_takes_bf16():
        pytest.skip("torch's oneDNN takes no bfloat16 on this CPU")
    monkeypatch.setattr(cpu_products, "_onednn_takes_bf16", lambda: reordered)
    model = load_causal_lm(str(tiny_model), torch.bfloat16)
    ids = torch.tensor([[0, 5, 6, 7], [1, 2, 3, 4]]).repeat(8, 1)  # 16 rows: the BLAS's `weight @ x`
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]).repeat(8, 1)
    with torch.no_grad():
        caches = [model(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                        use_cache=True).past_key_values for _ in range(2)]
        fast, slow = FastDecoder(model, caches[0], mask, 3), ForwardDecoder(model, caches[1], mask)
        assert fast.layout == ("packed" if reordered else "columns")
        for token in (9, 10, 11):
            got, want = fast.step(torch.full((16,), token)), slow.step(torch.full((16,), token))
            assert got.dtype == torch.float32 and got.is_contiguous()
            torch.testing.assert_close(got, want.float(), rtol=0.05, atol=0.05)
