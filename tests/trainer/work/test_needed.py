"""What a phase needs, worked out by hand for a tiny shape: a prompt once for its group, only
real tokens (padding excluded), logits only where a token is scored, the update 3x a forward,
generation's weights read once per decoding step of each decode batch, AdamW's 28 bytes."""

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.mapper.models import ModelShape
from hflow.trainer.config.load import build_recipe
from hflow.trainer.work.account import phase_needs, work_metrics
from hflow.trainer.work.needed import (
    Counts,
    computed_flops,
    Part,
    forward_flops,
    generation_bytes,
    generation_parts,
    lora_params,
    reward_counts,
    scoring_counts,
    step_rows,
    update_bytes,
    update_flops,
    update_parts,
    whole,
)

# 2 layers, hidden 4, 2 heads of 2 (1 KV head: kv_dim 2), ffn 8, vocabulary 10.
# A layer: q, o 16 each, k, v 8 each, MLP 3 x 32, two norms 4 each: 152. Body 304, LM head 40.
# All weights: embedding 40 + 304 + final norm 4 + LM head 40 = 388.
SHAPE = ModelShape("hand", layers=2, hidden=4, heads=2, kv_heads=1, ffn=8, vocab=10)

# Prompt group "a" (3 tokens) with responses of 2 and 4 tokens, group "b" (2 tokens, left-padded)
# with a response of 1 token (right-padded): P = 3, R = 4.
MASK = torch.tensor([[1, 1, 1, 1, 1, 0, 0],
                     [1, 1, 1, 1, 1, 1, 1],
                     [0, 1, 1, 1, 0, 0, 0]])
ROWS = step_rows(MASK, 4, ["a", "a", "b"])


def test_rows_count_real_tokens_and_prompt_groups():
    assert ROWS.prompt_lengths.tolist() == [3, 3, 2]
    assert ROWS.response_lengths.tolist() == [2, 4, 1]
    assert ROWS.group_prompts().tolist() == [3, 2]
    assert step_rows(MASK, 4, None).group_prompts().tolist() == [3, 3, 2]  # no uids: each row alone


# Prompt [5, 6, 7] sampled under two uids (rows 0 and 1), prompt [5, 6, 8] (row 2); responses of
# 2, 4 and 1 tokens, as MASK's.
TWO_UIDS_IDS = torch.tensor([[5, 6, 7, 1, 1, 0, 0],
                             [5, 6, 7, 1, 1, 1, 1],
                             [5, 6, 8, 1, 0, 0, 0]])
TWO_UIDS_MASK = torch.tensor([[1] * 5 + [0] * 2, [1] * 7, [1] * 4 + [0] * 3])


def test_the_same_prompt_in_two_groups_is_needed_once():
    # Two uids sampling one prompt (a data set that holds it twice), and a third prompt of the same
    # length but other tokens: the prompt's tokens, not the uid, decide what can be run once.
    rows = step_rows(TWO_UIDS_MASK, 4, ["a", "b", "c"], TWO_UIDS_IDS)
    assert rows.groups.tolist() == [0, 0, 1]
    assert rows.group_prompts().tolist() == [3, 3]
    assert step_rows(TWO_UIDS_MASK, 4, ["a", "b", "c"]).group_prompts().tolist() == [3, 3, 3]  # by uid alone


def test_tokens_prompts_begin_with_alike_are_needed_once():
    # Prompts [5, 6, 7] and [5, 6, 8] begin alike: the second needs only its last token, at
    # position 2 (3 keys); the first its 3 (1 + 2 + 3 keys). Responses as in the scoring test
    # below: row 0 one step at position 3 (4 keys), row 1 three at 3, 4, 5 (15), row 2 none.
    rows = step_rows(TWO_UIDS_MASK, 4, ["a", "b", "c"], TWO_UIDS_IDS)
    assert rows.begun.tolist() == [0, 0, 2] and rows.group_begun().tolist() == [0, 2]
    assert scoring_counts(rows) == Counts(tokens=(3 + 1) + 4, keys=(6 + 3) + 19, logits=2 + 4)
    # the prefill needs the same prompt positions; a reward model too, then every response token
    prefill = generation_parts(SHAPE, rows, 8, 4)["prefill"]
    assert prefill.flops == forward_flops(SHAPE, True, Counts(4, 9, 2))
    assert reward_counts(rows).tokens == 4 + 2 + 4 + 1


def test_a_decoding_step_reads_what_running_prompts_begin_with_alike_once():
    # Two groups of one row each: prompts [5, 6, 7, 1] and [5, 6, 7, 2] (3 tokens alike), responses
    # of 3 and 2 tokens (2 and 1 decoding steps). Step 0: both run, their trie is 4 + 1 columns,
    # and each row's own token: 5 + 2. Step 1: only the first, 4 + 2 (its two own tokens).
    ids = torch.tensor([[5, 6, 7, 1, 3, 3, 3], [5, 6, 7, 2, 3, 3, 0]])
    mask = torch.tensor([[1] * 7, [1] * 6 + [0]])
    rows = step_rows(mask, 3, ["a", "b"], ids)
    assert rows.begun.tolist() == [0, 3]
    kv = SHAPE.kv_bytes_per_token(4)
    weights = 4 * SHAPE.params(True)
    parts = generation_parts(SHAPE, rows, 8, 4)
    assert parts["decode_2"].nbytes == weights + (5 + 2) * kv
    assert parts["decode_1"].nbytes == weights + (4 + 2) * kv
    assert step_rows(mask, 3, ["a", "b"]).begun is None  # without the tokens, no prompt begins like another


def test_scoring_counts_a_shared_prompt_once_and_no_padding():
    # prompts once: 3 + 2 = 5 positions; responses need r - 1 more: 1 + 3 + 0 = 4
    # keys (position p attends to p + 1): prompts 1+2+3 + 1+2 = 9; row 0 at position 3: 4;
    # row 1 at positions 3, 4, 5: 4 + 5 + 6 = 15; row 2: none -> 28
    # logits: the last prompt position once per group (2), then r - 1 per row (4)
    assert scoring_counts(ROWS) == Counts(tokens=9, keys=28, logits=6)
    # 2 x 304 x 9 + 4 x 2 layers x 4 hidden x 28 + 2 x 40 x 6
    assert forward_flops(SHAPE, True, scoring_counts(ROWS)) == 5472 + 896 + 480


def test_a_reward_model_reads_every_response_token_and_one_score_per_row():
    # prompts 5 + responses 7 positions; keys 9 + (4 + 5) + (4 + 5 + 6 + 7) + 3 = 43; 3 scores
    assert reward_counts(ROWS) == Counts(tokens=12, keys=43, logits=3)
    assert forward_flops(SHAPE, False, reward_counts(ROWS)) == 2 * 304 * 12 + 32 * 43 + 2 * 4 * 3


def test_computed_flops_count_the_backward_twice():
    counted = {"tokens": 10, "keys": 5, "logits": 3, "backward_tokens": 1, "backward_keys": 2, "backward_logits": 1}
    forward = 2 * 304 * 10 + 32 * 5 + 2 * 40 * 3
    backward = 2 * 304 * 1 + 32 * 2 + 2 * 40 * 1
    assert computed_flops(SHAPE, True, counted) == forward + 2 * backward


def test_generation_reads_the_weights_per_decoding_step_of_each_decode_batch():
    # float32 weights: 388 x 4 = 1552 bytes. Decode batches of 2 rows: rows 0-1 decode max(1, 3) = 3
    # steps after their prefill (4 reads), row 2 none (1 read): 5 x 1552. KV cache, per key 2 (K and V)
    # x 2 layers x kv_dim 2 x 4 bytes = 32: group "a"'s prompt once at each of its 3 steps (3 x 3
    # keys), its rows' own tokens 1 and 1 + 2 + 3; group "b" none: 16 keys (19 read row by row).
    assert generation_bytes(SHAPE, ROWS, batch_rows=2, dtype_bytes=4) == 5 * 1552 + 16 * 32
    alone = step_rows(MASK, 4, None)  # each row its own group: its prompt at each of its steps
    assert generation_bytes(SHAPE, alone, batch_rows=2, dtype_bytes=4) == 5 * 1552 + 19 * 32


def test_generation_is_its_prefill_then_its_decoding_steps_by_live_rows():
    # Decode batches of 2 rows. Prefill: prompts 3 + 2 tokens, keys 6 + 3, a logit per group:
    # 2 x 304 x 5 + 32 x 9 + 2 x 40 x 2 FLOPs, the weights read once per batch (2 x 1552).
    # Batch 0 (rows 0 and 1, 1 and 3 steps): step 0 has 2 live rows, each reading its prompt's 3
    # keys and its own 1: 2 x 304 x 2 + 32 x 8 + 2 x 40 x 2 FLOPs, 1552 + (3 + 2) x 32 bytes (the
    # prompt's keys once for the group); steps 1 and 2 one row each, with 5 and 6 keys. Batch 1
    # (row 2, a 1-token response) decodes nothing.
    parts = generation_parts(SHAPE, ROWS, batch_rows=2, dtype_bytes=4)
    assert parts == {"prefill": Part(3040 + 288 + 160, 2 * 1552, 2),
                     "decode_2": Part(1216 + 256 + 160, 1552 + 5 * 32, 1),
                     "decode_1": Part((608 + 160 + 80) + (608 + 192 + 80), 2 * 1552 + (5 + 6) * 32, 2)}
    assert whole(parts) == (forward_flops(SHAPE, True, scoring_counts(ROWS)),
                            generation_bytes(SHAPE, ROWS, batch_rows=2, dtype_bytes=4))
    # one batch of all 3 rows: step 0 has 2 live rows (2 and 3 fall in "decode_2"), steps 1-2 one
    one = generation_parts(SHAPE, ROWS, batch_rows=3, dtype_bytes=4)
    assert {name: p.passes for name, p in one.items()} == {"prefill": 1, "decode_2": 1, "decode_1": 2}
    assert whole(one)[0] == whole(parts)[0]


def test_an_update_reads_weights_twice_and_adamw_state_per_optimizer_step():
    # per step: forward + backward 2 x 1552, AdamW 28 x 388 bytes; 2 steps
    assert update_bytes(SHAPE, True, 4, optimizer_steps=2, trained_params=388) == 2 * (2 * 1552 + 28 * 388)
    # AdamW waits for the gradients: a part of its own, after the passes
    assert update_parts(SHAPE, True, 4, 2, 388, flops=10.0) == {"passes": Part(10.0, 2 * 2 * 1552, 2),
                                                                "optimizer": Part(0.0, 2 * 28 * 388, 2)}
    # LoRA rank 2 on q (4 -> 4) and v (4 -> 2): 2 layers x (2 x 8 + 2 x 6) = 56
    assert lora_params(SHAPE, 2, ["q_proj", "v_proj"]) == 56


def _recipe(epochs=1, mini_batch_size=None):
    actor = {"epochs": epochs, "mini_batch_size": mini_batch_size, "micro_batch_size": 2}
    return build_recipe({"algorithm": "grpo", "model": {"path": "unused"}, "data": {"train": "synthetic:digits"},
                         "rollout": {"n": 2}, "trainer": {"prompts_per_step": 2}, "actor": actor}, {}, "test")


def test_the_update_needs_three_forwards_per_epoch():
    recipe = _recipe(epochs=2, mini_batch_size=2)
    flops, nbytes = whole(phase_needs("update_actor", "actor", SHAPE, ROWS, recipe))
    assert flops == 2 * 3 * forward_flops(SHAPE, True, scoring_counts(ROWS))
    # 2 epochs x 4 sequences / 2 per mini-batch = 4 optimizer steps, float32 on the CPU
    assert nbytes == update_bytes(SHAPE, True, 4, 4, SHAPE.params(True))


def test_each_optimizer_step_after_the_first_needs_what_every_prompt_begins_with_again():
    # Prompts [5, 6, 7] and [5, 6, 8] begin alike with 2 tokens (positions 0 and 1: 1 + 2 keys, no
    # logits); the recipe's 4 sequences in mini-batches of 2 are 2 optimizer steps an epoch.
    rows = step_rows(TWO_UIDS_MASK, 4, ["a", "b", "c"], TWO_UIDS_IDS)
    assert rows.shared_by_all() == 2
    once, again = forward_flops(SHAPE, True, scoring_counts(rows)), forward_flops(SHAPE, True, Counts(2, 3, 0))
    assert update_flops(SHAPE, True, rows, epochs=1, optimizer_steps=1) == 3 * once
    for epochs in (1, 2):
        flops, _ = whole(phase_needs("update_actor", "actor", SHAPE, rows, _recipe(epochs, mini_batch_size=2)))
        assert flops == 3 * (epochs * once + epochs * again)  # 2 x epochs steps, one each again
    # One prompt group: its prompt short of its last token; without the prompts' tokens, nothing.
    assert step_rows(TWO_UIDS_MASK[:2], 4, ["a", "a"], TWO_UIDS_IDS[:2]).shared_by_all() == 2
    assert step_rows(TWO_UIDS_MASK, 4, ["a", "b", "c"], torch.tensor([[5, 6, 7, 1, 1, 0, 0],
                                                                       [5, 6, 7, 1, 1, 1, 1],
                                                                       [4, 6, 7, 1, 0, 0, 0]])).shared_by_all() == 0
    assert ROWS.shared_by_all() == 0


class _Group:
    def __init__(self, counts):
        self.counts = counts

    def has_method(self, name):
        return True

    def take_work(self):
        return self.counts  # one entry per rank


def test_step_metrics_sum_every_groups_ranks(monkeypatch):
    from hflow.trainer.work import account as work_account

    monkeypatch.setattr(work_account, "role_shapes", lambda recipe: {"actor": SHAPE})
    one = {"generate": {"actor": {"tokens": 10}}, "eval": {"actor": {"tokens": 99}}}
    groups = {"actor": _Group([one, one]), "reward": _Group([{}])}
    view = Batch({"attention_mask": MASK, "response_mask": MASK[:, 3:]}, {"uid": ["a", "a", "b"]})
    metrics = work_metrics(groups, _recipe(), view, {"generate": 0.1, "reward": 0.1})
    assert metrics["work/generate/computed_flops"] == 2 * 304 * 20  # both ranks' tokens
    assert metrics["work/generate/needed_flops"] == forward_flops(SHAPE, True, scoring_counts(ROWS))
    parts = generation_parts(SHAPE, ROWS, work_account.decode_batch_rows(_recipe()), 4)
    assert set(metrics) == {f"work/generate/{k}" for k in ("needed_flops", "needed_bytes", "computed_flops")} | {
        f"work/generate/part/{name}/{field}" for name in parts for field in ("flops", "bytes", "passes")}
    assert metrics["work/generate/part/decode_1/passes"] == 2
    assert work_account.event_parts(metrics, "generate") == parts


@pytest.mark.parametrize("phase", ["old_log_prob", "reference"])
def test_scoring_passes_need_one_forward_and_one_read_of_the_weights(phase):
    assert phase_needs(phase, "actor", SHAPE, ROWS, _recipe()) == {
        "pass": Part(forward_flops(SHAPE, True, scoring_counts(ROWS)), 1552)}
