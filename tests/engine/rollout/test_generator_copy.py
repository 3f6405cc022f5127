"""The async generator copy: refreshed from the training weights exactly, it samples what the
training module itself samples, stamps its version, and can be cancelled mid-generation."""

import pytest
import torch

from hflow.engine.models.loading import load_causal_lm, load_tokenizer
from hflow.engine.rollout.generation import GenerationCancelled, HFGenerator, SamplingParams
from hflow.engine.rollout.generator_copy import GeneratorCopy
from hflow.engine.rollout.weight_sync import bucket_count, weight_buckets


def _copy(tiny_model, tok) -> GeneratorCopy:
    return GeneratorCopy(str(tiny_model), False, torch.device("cpu"), torch.float32, tok,
                         batch_size=8, bucket_bytes=1 << 16)  # several buckets


def test_a_refreshed_copy_holds_the_training_weights_and_samples_what_they_sample(tiny_model):
    tok = load_tokenizer(str(tiny_model))
    trained = load_causal_lm(str(tiny_model), torch.float32)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))  # a policy that moved away from the files on disk
    copy = _copy(tiny_model, tok)
    with pytest.raises(RuntimeError, match="never refreshed"):
        copy.generate([[1, 2, 3]], 2, SamplingParams(max_new_tokens=4), torch.Generator().manual_seed(0))
    copy.refresh(trained, version=3)
    for name, p in trained.named_parameters():
        assert torch.equal(copy.params[name], p), name
    prompts = [tok.encode("write digits: ")] * 2
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    out, version = copy.generate(prompts, 2, params, torch.Generator().manual_seed(7))
    want = HFGenerator(trained, [tok.eos_token_id], tok.pad_token_id, 8).generate(
        prompts, 2, params, torch.Generator().manual_seed(7))
    assert version == 3
    assert torch.equal(out["responses"], want["responses"])
    assert torch.equal(out["rollout_log_probs"], want["rollout_log_probs"])


def test_buckets_received_one_by_one_load_the_weights_and_the_version_with_the_last(tiny_model):
    # The rollout role's path (ray backend): the actor's buckets arrive as separate calls.
    tok = load_tokenizer(str(tiny_model))
    trained = load_causal_lm(str(tiny_model), torch.float32)
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(1.5)
    copy = _copy(tiny_model, tok)
    buckets = [[(name, t.clone()) for name, t in bucket]
               for bucket in weight_buckets(trained, 1 << 16, torch.float32)]
    assert len(buckets) == bucket_count(trained, 1 << 16, torch.float32) > 2
    for bucket in buckets[:-1]:
        copy.load_bucket(bucket, None)
    assert copy.version == -1  # not a version until its last bucket is in
    copy.load_bucket(buckets[-1], 4)
    assert copy.version == 4
    for name, p in trained.named_parameters():
        assert torch.equal(copy.params[name], p), name
    with pytest.raises(RuntimeError, match="no parameter 'lm_head.extra'"):
        copy.load_bucket([("lm_head.extra", torch.zeros(2))], None)


def test_a_cancelled_copy_stops_at_its_next_token(tiny_model):
    tok = load_tokenizer(str(tiny_model))
    copy = _copy(tiny_model, tok)
    copy.refresh(load_causal_lm(str(tiny_model), torch.float32), version=0)
    copy.cancel()
    with pytest.raises(GenerationCancelled, match="at token 0"):
        copy.generate([[1, 2, 3]], 2, SamplingParams(max_new_tokens=4), torch.Generator().manual_seed(0))
