"""The prefill with the prompts' common prefix run once (engine/rollout/prefill.py) against the
whole prompts run as one left-padded batch: the same logits, the same greedy tokens and log-probs,
and the meter counts the prefix once."""

import pytest
import torch

from hflow.engine import work_meter
from hflow.engine.kernels import decode_attention
from hflow.engine.models.loading import load_causal_lm, load_tokenizer
from hflow.engine.rollout import decode_cache, prefill
from hflow.engine.rollout.generation import HFGenerator, SamplingParams

HEADER = "you are a careful assistant. answer in digits only. "


def _prompts(tok):
    questions = ["write digits: ", "say q: ", "echo abc: ", "a much longer prompt than the others: "]
    return [tok(HEADER + q, add_special_tokens=False).input_ids for q in questions]


def _whole(monkeypatch):
    monkeypatch.setattr(prefill, "MIN_SHARED_TOKENS", 10 ** 9)


def test_a_shared_prefix_gives_the_whole_prompts_logits(tiny_model, monkeypatch):
    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32)
    prompts = _prompts(tok)
    shared = prefill.prefix_to_share(prompts)
    assert shared >= len(tok(HEADER, add_special_tokens=False).input_ids) - 1 > 0
    with torch.no_grad():
        logits, cache, mask, _ = prefill.prefill(model, prompts, tok.pad_token_id, torch.device("cpu"))
        _whole(monkeypatch)
        want, _, whole_mask, _ = prefill.prefill(model, prompts, tok.pad_token_id, torch.device("cpu"))
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(mask.sum(-1), whole_mask.sum(-1))  # every prompt's real tokens, all in the cache
    assert mask[:, :shared].all() and cache.get_seq_length() == mask.shape[1]


@pytest.mark.parametrize("n", [1, 2])
def test_generation_on_a_shared_prefix_samples_as_on_whole_prompts(tiny_model, monkeypatch, n):
    """The lean step's cache holds the prefix once for all rows (with the compiled kernel), one
    sample per prompt or several: the same greedy tokens and log-probs as on whole prompts."""
    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32)
    engine = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, 8)
    prompts = _prompts(tok)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    held = []
    init = decode_cache.SharedPromptCache.__init__
    monkeypatch.setattr(decode_cache.SharedPromptCache, "__init__",
                        lambda self, *a, **k: init(self, *a, **k) or held.append(self.prefix is not None))
    shared = engine.generate(prompts, n, params)
    if decode_attention.available() is not None:
        assert held == [True]
    _whole(monkeypatch)
    whole = engine.generate(prompts, n, params)
    assert torch.equal(shared["responses"], whole["responses"])
    assert torch.equal(shared["input_ids"], whole["input_ids"])
    torch.testing.assert_close(shared["rollout_log_probs"], whole["rollout_log_probs"], rtol=1e-5, atol=1e-5)


def test_the_meter_counts_the_prefix_once(tiny_model):
    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32)
    work_meter.attach(model, "actor")
    prompts = _prompts(tok)
    shared = prefill.prefix_to_share(prompts)
    work_meter.take()
    with torch.no_grad():
        prefill.prefill(model, prompts, tok.pad_token_id, torch.device("cpu"))
    counted = work_meter.take()["other"]["actor"]
    rest = max(len(p) - shared for p in prompts)  # the rests run left-padded to the longest
    assert counted["tokens"] == shared + len(prompts) * rest
    assert counted["keys"] == work_meter.causal_keys(1, shared, 0) + work_meter.causal_keys(len(prompts), rest, shared)
