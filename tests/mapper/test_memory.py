"""Memory figures checked by hand for Llama-2-7B (and GQA on Qwen2.5-7B)."""

import pytest

from hflow.mapper import memory
from hflow.mapper.devices import resolve_device
from hflow.mapper.models import MODELS
from hflow.mapper.search import _best_combination
from hflow.mapper.strategy import Candidate, Setting, candidates
from hflow.mapper.workload import Workload

LLAMA7 = MODELS["llama2-7b"]
# Per layer: q, k, v, o (4 x 4096^2) + SwiGLU (3 x 4096 x 11008) + two RMSNorms (2 x 4096);
# plus embedding and untied lm_head (2 x 32000 x 4096) and the final norm (4096).
P7 = 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 2 * 32000 * 4096 + 4096


def test_llama2_7b_parameter_count():
    assert P7 == 6_738_415_616  # the count Meta reports for Llama-2-7b
    assert LLAMA7.params() == P7
    # A critic or reward model swaps the 32000-way lm_head for a 1-way value head.
    assert LLAMA7.params(lm_head=False) == P7 - 32000 * 4096 + 4096


def test_bf16_weights_are_two_bytes_per_parameter():
    states = memory.model_states(P7, dtype_bytes=2, tp=1, pp=1, dp=1, zero=0)
    assert states.weights == 2 * P7 == 13_476_831_232
    assert memory.frozen_weights(P7, 2, tp=1, pp=1) == 2 * P7
    assert memory.generation_weights(P7, 2, tp=4) == 2 * P7 / 4


@pytest.mark.parametrize("zero, per_param", [
    (0, 2 + 2 + 12),          # bf16 weights + bf16 grads + fp32 master, momentum, variance
    (1, 2 + 2 + 12 / 8),      # stage 1 partitions the optimizer states over dp = 8
    (2, 2 + (2 + 12) / 8),    # stage 2 also the gradients
    (3, (2 + 2 + 12) / 8),    # stage 3 also the weights
])
def test_adam_states_by_zero_stage(zero, per_param):
    states = memory.model_states(P7, dtype_bytes=2, tp=1, pp=1, dp=8, zero=zero)
    assert states.total == pytest.approx(per_param * P7)


def test_model_parallelism_divides_states_before_zero():
    # tp=2, pp=2: every state / 4; ZeRO-1 over dp=2 halves the optimizer states again.
    states = memory.model_states(P7, dtype_bytes=2, tp=2, pp=2, dp=2, zero=1)
    assert states.weights == pytest.approx(2 * P7 / 4)
    assert states.grads == pytest.approx(2 * P7 / 4)
    assert states.optimizer == pytest.approx(12 * P7 / 8)


def test_offload_keeps_only_weights_on_the_device_and_fp32_accounting():
    assert memory.model_states(P7, 2, 1, 1, 8, zero=2, offload=True).total == pytest.approx(2 * P7)
    assert memory.model_states(P7, 4, 1, 1, 1, zero=0).total == pytest.approx((4 + 4 + 8) * P7)


def test_kv_cache_per_token_and_gqa():
    # 2 (K and V) x 32 layers x 32 heads x 128 dims x 2 bytes = 512 KiB per token.
    assert LLAMA7.kv_bytes_per_token(2) == 524_288
    assert memory.kv_cache(LLAMA7, seqs=64, seq_len=2048, tp=2, dtype_bytes=2) == 64 * 2048 * 524_288 / 2
    qwen = MODELS["qwen/qwen2.5-7b-instruct"]  # 4 KV heads: 2 x 28 x 4 x 128 x 2 bytes
    assert qwen.kv_bytes_per_token(2) == 57_344
    # tp=8 exceeds the 4 KV heads: each device keeps one head, replicated.
    assert memory.kv_cache(qwen, 1, 1, tp=8, dtype_bytes=2) == 2 * 28 * 1 * 128 * 2


def test_training_activations_with_checkpointing():
    tokens = 1 * 2048
    kept_inputs = 32 * 4096 * tokens * 2  # each layer's input, bf16
    one_layer = (4 * 4096 + 2 * 4096 + 2 * 4096 + 3 * 11008) * tokens * 2  # recomputed layer
    logits = tokens * 32000 * 4 * 2  # fp32 logits and their gradient
    got = memory.train_activations(LLAMA7, True, micro_seqs=1, seq_len=2048, tp=1, checkpointing=True,
                                   dtype_bytes=2)
    assert got == kept_inputs + one_layer + logits
    without = memory.train_activations(LLAMA7, True, 1, 2048, 1, checkpointing=False, dtype_bytes=2)
    assert without == 32 * one_layer + logits


def test_only_the_scored_positions_logits_count():
    """The LM head run on a response's 512 positions of 2,048: the logits of those alone, in
    training (with their gradient) and in a scoring forward; never more positions than the sequence."""
    tokens = 2048
    one_layer = (4 * 4096 + 2 * 4096 + 2 * 4096 + 3 * 11008) * tokens * 2
    got = memory.train_activations(LLAMA7, True, 1, 2048, 1, checkpointing=False, dtype_bytes=2, scored_len=512)
    assert got == 32 * one_layer + 512 * 32000 * 4 * 2
    assert memory.inference_activations(LLAMA7, True, 1, 2048, 1, 2, scored_len=512) == one_layer + 512 * 32000 * 4
    assert memory.inference_activations(LLAMA7, True, 1, 2048, 1, 2, scored_len=4096) == \
        memory.inference_activations(LLAMA7, True, 1, 2048, 1, 2)


def _cand(name, seconds, resident, transient):
    return Candidate(name, 8, {}, (0.0, seconds, 0.0), (resident,) * 3, (0.0, transient, 0.0))


def test_colocated_set_peak_is_residents_plus_largest_transient_and_oom_is_rejected():
    fast_big = _cand("a", 1.0, resident=6.0, transient=1.0)
    slow_small = _cand("a", 2.0, resident=3.0, transient=1.0)
    other = _cand("b", 1.0, resident=2.0, transient=3.0)
    # 6 + 2 resident + max(1, 3) transient = 11 > 10: the fast strategy does not fit with `other`.
    assert _best_combination([[fast_big, slow_small], [other]], capacity=10.0) == [slow_small, other]
    assert _best_combination([[fast_big, slow_small], [other]], capacity=11.0) == [fast_big, other]
    assert _best_combination([[fast_big, slow_small], [other]], capacity=7.9) is None


def test_hybrid_engine_releases_training_state_while_generating():
    workload = Workload("ppo", {"actor": LLAMA7}, prompts=64, n=1, prompt_len=512, response_len=512,
                        mini_batch=64, micro_batch=4)
    setting = Setting(workload, resolve_device("a100-80g"), 8)
    for cand in candidates(setting, "actor", 8):
        gen, detail = cand.strategy["generate"], cand.detail
        held = max(detail["generation_weights"], detail["weights"]) + detail["kv_cache"]
        state = detail["grads"] + detail["optimizer"]
        expected = held if gen["release_train_state"] else held + state
        assert cand.resident[0] == pytest.approx(expected)
        assert cand.resident[2] == pytest.approx(detail["weights"] + state)  # all back for training
        assert cand.fits(setting.capacity)
