"""The lean decoding step's two cache layouts (engine/rollout/decode_cache.py): prompts shared by
their samples give the same logits as the plain forward on a repeated cache, step after step and
after rows leave the batch, with either CPU product route; the engine samples the same tokens."""

import pytest
import torch

from hflow.engine.kernels import decode_attention
from hflow.engine.padding import positions
from hflow.engine.rollout import decode_cache, fast_decode
from hflow.engine.rollout.decode_cache import RowCache, SharedPromptCache, shares_prompts
from hflow.engine.rollout.fast_decode import FastDecoder
from hflow.engine.rollout.generation import ForwardDecoder, HFGenerator, SamplingParams, kept_in_place

REPEAT = 3


def _model():
    """Qwen2-shaped: q/k/v biases, 2 key-value heads for 4 query heads."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float().eval()
    for name, param in model.named_parameters():  # biases are zero when built: make them count
        if name.endswith("bias"):
            param.data.normal_(0, 0.5)
    return model


def test_the_layout_is_chosen_by_the_prompt_keys_a_step_would_read_again():
    """With torch's products, by the prompt keys a step would read again; with the compiled kernel,
    from two samples."""
    assert shares_prompts(True, 4, 128, False) and shares_prompts(True, 2, decode_cache.SHARED_PROMPT_KEYS, False)
    assert not shares_prompts(True, 4, 64, False)  # 192 repeated keys: repeating is faster
    assert shares_prompts(True, 4, 64, True) and shares_prompts(True, 2, 1, True)
    for compiled in (False, True):
        assert not shares_prompts(True, 1, 10_000, compiled)  # one sample: nothing to share
        assert not shares_prompts(False, 16, 10_000, compiled)  # SDPA's fused attention (GPU, bfloat16) repeats


@pytest.mark.parametrize("layout", ["shared", "shared without the compiled kernel", "rows",
                                    "rows without the compiled kernel"])
def test_shared_prompts_decode_as_the_forward_on_a_repeated_cache(layout, monkeypatch, cpu_products):
    """3 prompts of 5, 2 and 7 tokens (left-padded), 3 samples each; after two steps rows 1, 4 and 5
    leave (the last rows fill their slots), after three the first prompt's last samples (its whole
    group gone: the shared cache keeps only the other two prompts), then a fifth step: every step's
    logits are the forward's. Both caches attend through the compiled kernel where it can be built
    (`engine/kernels/`), and through torch's products without it; with oneDNN's products the step's
    element-wise work is compiled too (`_step_compiled`)."""
    shared = layout.startswith("shared")
    monkeypatch.setattr(fast_decode, "shares_prompts", lambda *args: shared)
    if layout.endswith("kernel"):
        monkeypatch.setattr(decode_attention, "available", lambda: None)
    model = _model()
    g = torch.Generator().manual_seed(1)
    lengths = [5, 2, 7]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, -n:] = torch.randint(3, 97, (n,), generator=g)
        mask[row, -n:] = 1
    with torch.no_grad():
        prefill = lambda: model(input_ids=ids, attention_mask=mask, position_ids=positions(mask),  # noqa: E731
                                use_cache=True).past_key_values
        fast = FastDecoder(model, prefill(), mask, 5, repeat=REPEAT)
        assert isinstance(fast.cache, SharedPromptCache if shared else RowCache)
        if layout.endswith("kernel"):
            assert fast.cache.kernel is None and fast.compiled is None
        else:
            assert (fast.cache.kernel is None) == (decode_attention.available() is None)
            # the step's element-wise work compiled too where it multiplies as rows on joined products
            assert (fast.compiled is not None) == (fast.cache.kernel is not None and fast.layout == "packed")
        repeated = prefill()
        repeated.batch_repeat_interleave(REPEAT)
        slow = ForwardDecoder(model, repeated, mask.repeat_interleave(REPEAT, 0))
        rows = torch.arange(len(lengths) * REPEAT)  # the output row in each batch slot
        for step in range(5):
            leaving = {2: [1, 4, 5], 3: [0, 2]}.get(step)  # rows 0-2 are the first prompt's
            if leaving:
                keep = kept_in_place(torch.isin(rows, torch.tensor(leaving)))
                for decoder in (fast, slow):
                    decoder.select(keep)
                rows = rows[keep]
            tokens = torch.randint(3, 97, (len(rows),), generator=g)
            torch.testing.assert_close(fast.step(tokens), slow.step(tokens), rtol=1e-5, atol=1e-5)
        if shared:
            assert len(fast.cache.prompt_keys[0]) == 2  # the first prompt's keys were let go


def test_the_engine_samples_the_same_tokens_with_shared_prompts(tiny_model, monkeypatch):
    """Sampling with rows ending at different steps: the lean step on shared prompts gives the plain
    forward's tokens and log-probs."""
    from hflow.engine.models.loading import load_causal_lm, load_tokenizer

    monkeypatch.setattr(decode_cache, "SHARED_PROMPT_KEYS", 1)
    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32)
    fast = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, 16)
    slow = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, 16, fast=False)
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ["write digits: ", "say q: ", "echo ab: "]]
    params = SamplingParams(max_new_tokens=30, temperature=0.9)
    a = fast.generate(prompts, 4, params, torch.Generator().manual_seed(7))
    b = slow.generate(prompts, 4, params, torch.Generator().manual_seed(7))
    lengths = a["response_mask"].sum(-1)
    assert len(set(lengths.tolist())) > 1  # rows left the batch at different steps
    assert torch.equal(a["responses"], b["responses"])
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], rtol=1e-5, atol=1e-5)


def test_the_kernel_is_not_built_where_the_step_would_not_run_it(monkeypatch):
    """In bfloat16 (as on a GPU) the step keeps torch's fused attention: the kernel is never asked for."""
    asked = []
    monkeypatch.setattr(decode_attention, "available", lambda: asked.append(1))
    model = _model().to(torch.bfloat16)
    ids, mask = torch.randint(3, 97, (2, 4)), torch.ones(2, 4, dtype=torch.long)
    with torch.no_grad():
        prefill = model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
    fast = FastDecoder(model, prefill, mask, 3, repeat=REPEAT)
    assert isinstance(fast.cache, RowCache) and fast.cache.kernel is None and not asked
