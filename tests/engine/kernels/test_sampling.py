"""The sampling kernel (engine/kernels/sampling.c) against the torch path it replaces in
`rollout/generation.py` (`drawn` without it) and against float64: the same tokens, log-probs and
entropies within float32's rounding (closer to float64 than torch's float32 path), the distribution
followed, a token of probability zero never drawn at either end of the uniform numbers, bad layouts
refused; and a generation on the CPU samples through it, with the same tokens as without it."""

import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from hflow.engine.kernels import sampling
from hflow.engine.models.loading import load_causal_lm, load_tokenizer
from hflow.engine.rollout import generation
from hflow.engine.rollout.generation import HFGenerator, SamplingParams, UniformDraws, drawn

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler: the kernel cannot be built here")


@pytest.fixture(scope="module")
def kernel():
    found = sampling.available()
    assert found is not None, "the kernel was not built on a machine with a C compiler (see the log)"
    return found


def _draws(u: torch.Tensor) -> UniformDraws:
    draws = UniformDraws(len(u), steps=1, generator=None, device=torch.device("cpu"))
    draws.values = u[None]
    return draws


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("rows,vocab", [(32, 49152), (5, 70), (1, 1), (3, 65)])
def test_the_kernel_draws_what_torch_draws_with_log_probs_and_entropy_nearer_float64(kernel, temperature, rows,
                                                                                     vocab):
    g = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=g) * 3
    u = torch.rand(rows, generator=g)
    params = SamplingParams(max_new_tokens=1, temperature=temperature)
    tokens, log_probs, entropy = kernel(logits, u, temperature)
    ref_tokens, ref_log_probs, ref_entropy = drawn(logits, 0, params, _draws(u), None)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(log_probs, ref_log_probs, rtol=0, atol=3e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=0, atol=5e-5)
    exact = F.log_softmax(logits.double() / temperature, -1)
    exact_entropy = -(exact.exp() * exact).sum(-1)
    exact_log_probs = exact.gather(-1, tokens[:, None]).squeeze(-1)
    assert (log_probs.double() - exact_log_probs).abs().max() <= 2e-6
    assert (entropy.double() - exact_entropy).abs().max() <= 2e-6


def test_the_kernel_follows_the_distribution_and_a_row_s_draw_is_its_own(kernel):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.cat([probs.log(), torch.tensor([float("-inf")])]).expand(20000, 5).contiguous()
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    tokens, log_probs, _ = kernel(logits, u, 1.0)
    freq = torch.bincount(tokens, minlength=5).double() / len(tokens)
    # 20,000 draws: the standard error of a frequency is at most 0.0036; allow 4 of them.
    torch.testing.assert_close(freq[:4], probs.double(), atol=0.015, rtol=0)
    assert freq[4] == 0
    torch.testing.assert_close(log_probs, probs.log()[tokens], rtol=0, atol=1e-6)
    rows = torch.tensor([7, 19999, 3])
    assert torch.equal(kernel(logits[rows], u[rows], 1.0)[0], tokens[rows])


def test_the_kernel_never_draws_a_token_of_probability_zero(kernel):
    # u = 0 targets the whole mass, u near 1 the smallest positive amount; masked tokens (-inf)
    # before, between and after the allowed ones, and past the first span of 64 tokens.
    for width in (6, 200):
        logits = torch.full((3, width), float("-inf"))
        logits[:, 2], logits[:, width - 2] = torch.tensor(0.25).log(), torch.tensor(0.75).log()
        u = torch.tensor([0.0, 1.0 - 2.0**-24, 0.5])
        tokens, log_probs, entropy = kernel(logits, u, 1.0)
        assert tokens.tolist() == [width - 2, 2, width - 2]
        assert torch.isfinite(log_probs).all() and torch.isfinite(entropy).all()
        two_tokens = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
        torch.testing.assert_close(entropy, torch.full((3,), two_tokens), rtol=0, atol=1e-6)


@pytest.mark.parametrize("bad", [torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 4).t(), torch.randn(2, 4, 8)])
def test_a_layout_it_cannot_read_is_refused(kernel, bad):
    with pytest.raises(ValueError, match="sampling kernel takes"):
        kernel(bad, torch.rand(len(bad)), 1.0)


def test_one_uniform_number_per_row_and_a_positive_temperature(kernel):
    with pytest.raises(ValueError, match="one uniform number per row"):
        kernel(torch.randn(4, 8), torch.rand(3), 1.0)
    with pytest.raises(ValueError, match="positive"):
        kernel(torch.randn(4, 8), torch.rand(4), 0.0)


def test_a_cpu_generation_samples_through_the_kernel_with_the_tokens_of_torch_s_path(tiny_model, monkeypatch, kernel):
    """Plain sampling goes through the kernel; top-k and greedy do not; a generation with it and one
    without (the kernel off) give the same tokens and log-probs within rounding."""
    tok = load_tokenizer(str(tiny_model))
    model = load_causal_lm(str(tiny_model), torch.float32)
    engine = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, 8)
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ["write digits: ", "say q: ", "echo ab: "]]
    calls = []

    class Spy:
        def __call__(self, logits, u, temperature):
            calls.append(len(logits))
            return kernel(logits, u, temperature)

    monkeypatch.setattr(sampling, "available", lambda: Spy())
    params = SamplingParams(max_new_tokens=30, temperature=0.9)
    fused = engine.generate(prompts, 4, params, torch.Generator().manual_seed(5))
    assert calls and calls[0] == 8  # two prompts x 4 samples a decoding chunk
    for other in (SamplingParams(max_new_tokens=5, top_k=20), SamplingParams(max_new_tokens=5, greedy=True)):
        calls.clear()
        engine.generate(prompts, 4, other, torch.Generator().manual_seed(5))
        assert not calls
    monkeypatch.setattr(sampling, "available", lambda: None)
    plain = engine.generate(prompts, 4, params, torch.Generator().manual_seed(5))
    assert torch.equal(fused["responses"], plain["responses"])
    torch.testing.assert_close(fused["rollout_log_probs"], plain["rollout_log_probs"], rtol=0, atol=3e-5)
    torch.testing.assert_close(fused["rollout_entropy"], plain["rollout_entropy"], rtol=0, atol=5e-5)
    assert generation.sampling is sampling
