"""Memory per device of what hflow executes (mapper/executed.py), checked by hand on the tiny model.

The tiny Llama (2 layers, hidden 64, 4 heads of 16, MLP 192, 55 tokens) keeps every figure small
enough to follow: 113,856 parameters.
"""

from dataclasses import replace

import pytest

from hflow.mapper import memory
from hflow.mapper.devices import GB, resolve_device
from hflow.mapper.executed import GENERATOR, Generation, PoolRun, RoleRun, executed_memory, kept_while_generating
from hflow.mapper.models import MODELS
from hflow.mapper.workload import Workload

TINY = MODELS["tiny"]
# Per layer: q, k, v, o (4 x 64^2 = 16,384) + SwiGLU (3 x 64 x 192 = 36,864) + two norms (128) = 53,376;
# two layers, the embedding and the untied LM head (2 x 55 x 64) and the final norm (64).
P = 2 * 53_376 + 2 * 55 * 64 + 64
A100 = resolve_device("a100-80g")


def _workload(**models) -> Workload:
    # 4 prompts x 2 responses of 6 + 10 tokens: 8 sequences of 16 tokens per step, bf16, no checkpointing.
    return Workload("grpo", models or {"actor": TINY, "reference": TINY}, prompts=4, n=2, prompt_len=6,
                    response_len=10, dtype_bytes=2, checkpointing=False)


def _actor(zero: int, **generation) -> RoleRun:
    return RoleRun("actor", trained=True, zero_stage=zero, micro_seqs=2, rows=8,
                   generation=Generation("hf", batch=64, **generation))


def test_tiny_parameter_count():
    assert P == 113_856 == TINY.params()


def test_actor_and_reference_on_two_devices_by_hand():
    pool = PoolRun("pool0", 2, (_actor(zero=1), RoleRun("reference", micro_seqs=2, rows=8)))
    [mem] = executed_memory(_workload(), A100, [pool])
    actor, reference = mem.roles
    # ZeRO-1 over 2 devices in bf16: 2-byte weights, gradients accumulated in fp32 (4 bytes, whole),
    # Adam's 12 bytes (fp32 master, momentum, variance) split over the 2 devices.
    states = 2 * P + 4 * P + 12 * P // 2
    assert states == 1_366_272
    # Generation: the states stay (no offload) + the KV cache of the 4 sequences this device decodes
    # (8 / 2 devices, under the batch of 64): 16 tokens x 2 (K, V) x 2 layers x 4 heads x 16 dims x 2 bytes.
    kv = 4 * 16 * (2 * 2 * 4 * 16 * 2)
    assert kv == 32_768
    assert actor.resident == (states + kv, states, states)
    # Micro-batch of 2 sequences x 16 tokens = 32 tokens. A layer keeps 4h + 2h + 2 kv_dim + 3 ffn
    # = 256 + 128 + 128 + 576 = 1,088 values per token, in bf16; the LM head runs where a token is
    # scored, the 10 response positions and the prompt's last: 2 x 11 positions of 55 fp32 logits.
    layer, logits = 1_088 * 32 * 2, 2 * 11 * 55 * 4
    assert (layer, logits) == (69_632, 4_840)
    forward = layer + logits  # one layer at a time, and the logits
    train = 2 * layer + 2 * logits  # every layer kept (no checkpointing), the logits and their gradient
    assert actor.transient == (0.0, forward, train) == (0.0, 74_472, 148_944)
    # The reference: a full bf16 copy on each device, and one forward's working memory.
    assert reference.resident == (2 * P,) * 3 == (227_712,) * 3
    assert reference.transient == (0.0, forward, 0.0)
    # Colocated: both keep their bytes; the larger working memory of a stage comes on top.
    assert mem.peak == (states + kv + 2 * P, states + 2 * P + forward, states + 2 * P + train)
    assert mem.peak == (1_626_752, 1_668_456, 1_742_928)
    assert mem.worst == ("training", 1_742_928)


def test_long_prompts_count_the_logits_of_the_scored_positions_only():
    """A 2,048-token prompt with a 256-token response: the head runs on 257 positions a sequence,
    so the scoring forward holds a tenth of the logits the whole sequence would have."""
    long = replace(_workload(), prompt_len=2048, response_len=256)
    pool = PoolRun("pool0", 1, (RoleRun("reference", micro_seqs=2, rows=8),))
    [mem] = executed_memory(long, A100, [pool])
    layer = 1_088 * 2 * 2304 * 2
    assert mem.roles[0].transient == (0.0, layer + 2 * 257 * 55 * 4, 0.0)


def test_a_scoring_micro_batch_of_its_own_sizes_the_scoring_forward_only():
    # Scoring 4 sequences at a time (64 tokens) where the update takes 2: the scoring forward's one
    # layer and logits double (2 x (69,632 + 4,840)); the update's kept activations do not change.
    pool = PoolRun("pool0", 2, (replace(_actor(zero=1), score_seqs=4), RoleRun("reference", micro_seqs=4, rows=8)))
    [mem] = executed_memory(_workload(), A100, [pool])
    actor, reference = mem.roles
    assert actor.transient == (0.0, 148_944, 148_944)
    assert reference.transient == (0.0, 148_944, 0.0)


def test_zero3_shards_the_states_and_gathers_the_whole_weights_for_the_rollout():
    [mem] = executed_memory(_workload(), A100, [PoolRun("pool0", 4, (_actor(zero=3),))])
    [actor] = mem.roles
    window = 2 * P  # a pass gathers up to 1e9 parameters at a time: all of the tiny model
    assert memory.zero3_gathered(70_000_000_000, 2) == 2e9  # a 70B model: a 1e9-parameter window
    # Training: weights, gradients and Adam states all split over the 4 devices.
    assert actor.resident[2] == pytest.approx((2 + 2 + 12) * P / 4)
    assert actor.transient == pytest.approx((0.0, 69_632 + 4_840 + window, 2 * 69_632 + 2 * 4_840 + window))
    # Rollout: the gradients go to host memory (all ZeRO-3 can offload under torch's AdamW), the whole
    # weights are gathered into a bf16 generation copy, and 8 sequences over 4 devices put 2 in each
    # one's KV cache (512 bytes per token). Scoring: the copy is freed, the gradients stay away.
    kept = (2 + 12) * P / 4
    assert actor.resident[0] == pytest.approx(kept + 2 * P + 2 * 16 * 512)
    assert actor.resident[1] == pytest.approx(kept)


def test_frozen_models_are_a_full_copy_whatever_the_devices():
    llama70 = MODELS["llama2-70b"]
    work = _workload(actor=llama70, reference=llama70)
    pools = [PoolRun("p", n, (_actor(zero=3), RoleRun("reference", micro_seqs=2, rows=8))) for n in (8, 64)]
    small, big = executed_memory(work, A100, pools)
    assert small.roles[1].resident == big.roles[1].resident == (2 * llama70.params(),) * 3  # 138 GB each
    assert big.roles[0].resident[1] == pytest.approx(small.roles[0].resident[1] / 8)  # ZeRO-3 states: 1/dp


@pytest.mark.parametrize("zero, bf16, kept", [
    (0, True, "all"), (1, True, "all"),  # stage 0 and BF16_Optimizer cannot offload
    (1, False, "weights"), (2, True, "weights"),  # ZeRO-1 (fp32) and ZeRO-2 move master, moments, gradients
    (3, True, "weights+optimizer"),  # ZeRO-3 moves its gradients only (torch AdamW, not FusedAdam)
])
def test_what_the_training_state_leaves_on_the_gpu_while_generating(zero, bf16, kept):
    states = memory.ModelStates(weights=2.0, grads=3.0, optimizer=5.0)
    want = {"all": 10.0, "weights": 2.0, "weights+optimizer": 7.0}[kept]
    assert kept_while_generating(states, zero, bf16, offload=True) == want
    assert kept_while_generating(states, zero, bf16, offload=False) == 10.0


def test_vllm_holds_its_share_of_the_device_beside_the_training_weights():
    actor = replace(_actor(zero=2), generation=Generation("vllm", batch=64, tp=1, share=0.5, offload=True))
    [mem] = executed_memory(_workload(actor=TINY), A100, [PoolRun("pool0", 2, (actor,))])
    # ZeRO-2 offloads all but the bf16 weights; vLLM holds half of the 80 GB device.
    assert mem.roles[0].resident[0] == pytest.approx(2 * P + 40 * GB)


def test_async_generator_pool_holds_a_copy_and_its_kv_cache():
    [mem] = executed_memory(_workload(actor=TINY), A100,
                            [PoolRun("rollout", 1, (RoleRun(GENERATOR, generation=Generation("hf", batch=4)),))])
    assert mem.peak == (2 * P + 4 * 16 * 512,) * 3  # bf16 weights + 4 sequences' KV cache


def test_an_evaluation_s_larger_decoding_batch_sizes_the_kv_cache():
    """Each of 2 devices decodes 4 of the step's 8 sequences; an evaluation decoding 24 rows (of the
    step's length) at once holds 6x that KV cache, one decoding 3 rows less and changes nothing."""
    kv_row = 16 * (2 * 2 * 4 * 16 * 2)  # 16 tokens, K and V, 2 layers, 4 heads x 16, bf16
    generating = {}
    for evaluated in (0, 3, 24):
        pool = PoolRun("pool0", 2, (_actor(zero=1, evaluated=evaluated),))
        [mem] = executed_memory(_workload(actor=TINY), A100, [pool])
        generating[evaluated] = mem.roles[0].resident[0]
    assert generating[3] == generating[0]
    assert generating[24] - generating[0] == (24 - 4) * kv_row


def test_roles_of_unknown_shape_count_nothing():
    pool = PoolRun("pool0", 2, (_actor(zero=1), RoleRun("reward", micro_seqs=2, rows=8)))
    [mem] = executed_memory(_workload(actor=TINY), A100, [pool])
    assert [r.role for r in mem.roles] == ["actor"]
