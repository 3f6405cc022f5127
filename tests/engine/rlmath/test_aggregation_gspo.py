"""Loss aggregation modes and GSPO's sequence-level loss, against hand-computed values."""

import math

import pytest
import torch

from hflow.engine.rlmath.aggregation import aggregate
from hflow.engine.rlmath.policy_losses import gspo_policy_loss, ppo_policy_loss

# Two sequences: [1, 2, 3] (3 tokens) and [4, pad, pad] (1 token); a third row has no response.
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
M = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]]).float()


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (1 + 2 + 3 + 4) / 4),                   # 2.5: every token weighs the same
    ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),  # 3.0: every sequence weighs the same
    ("seq-mean-token-sum", ((1 + 2 + 3) + 4) / 2),          # 5.0
    ("seq-mean-token-sum-norm", ((1 + 2 + 3) + 4) / 2 / 10),  # 0.5: token sums over horizon 10
])
def test_aggregate_modes_hand_computed(mode, expected):
    assert float(aggregate(X, M, mode, horizon=10)) == pytest.approx(expected)


def test_aggregate_normalizer_replaces_the_local_count():
    # A micro-batch's share of a bigger mini-batch: 20 tokens, or 4 sequences, in all.
    assert float(aggregate(X, M, "token-mean", normalizer=20.0)) == pytest.approx(10 / 20)
    assert float(aggregate(X, M, "seq-mean-token-mean", normalizer=4.0)) == pytest.approx(6 / 4)
    # Without a horizon, sum-norm divides by the mask's width (3 here).
    assert float(aggregate(X, M, "seq-mean-token-sum-norm")) == pytest.approx(10 / 2 / 3)


def test_aggregate_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean"):
        aggregate(X, M, "sum")


def test_ppo_loss_default_is_token_mean_and_modes_change_the_weighting():
    logp = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    token_mean, _ = ppo_policy_loss(logp, logp, adv, mask)
    assert float(token_mean) == pytest.approx((-3 + 1) / 4)
    seq_mean, _ = ppo_policy_loss(logp, logp, adv, mask, mode="seq-mean-token-mean")
    assert float(seq_mean) == pytest.approx((-1 + 1) / 2)
    dr_grpo, _ = ppo_policy_loss(logp, logp, adv, mask, mode="seq-mean-token-sum-norm", horizon=6)
    assert float(dr_grpo) == pytest.approx((-3 / 6 + 1 / 6) / 2)


def test_gspo_sequence_ratio_and_clip_hand_computed():
    # Sequence 0: token log-ratios 0.2 and 0.0 -> mean 0.1 -> s = e^0.1 = 1.10517, A = +1:
    #   max(-1.10517, -clip(1.10517, 0.8, 1.2) = -1.10517) = -1.10517 (inside the clip range).
    # Sequence 1: one token, log-ratio 0.5 (the padded token's 3.0 is ignored) -> s = e^0.5 =
    #   1.64872, A = +2: max(-3.29744, -2 * 1.2 = -2.4) = -2.4 (clipped).
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.2, 0.0], [0.5, 3.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, 2.0])
    loss, metrics = gspo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert float(loss) == pytest.approx((-math.exp(0.1) - 2.4) / 2, rel=1e-6)
    assert metrics["clipfrac"] == pytest.approx(0.5)
    assert metrics["approx_kl"] == pytest.approx(-(0.2 + 0.0 + 0.5) / 3, rel=1e-6)


def test_gspo_gradient_is_the_sequence_ratio_times_the_mean_token_gradient():
    # d/dlogp_t of -A * exp(mean(logp - old)) = -A * s / |y| for each response token.
    logp = torch.tensor([[0.3, -0.1, 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    loss, _ = gspo_policy_loss(logp, old, torch.tensor([1.5]), torch.tensor([[1, 1, 0]]), 10.0, 10.0)
    loss.backward()
    s = math.exp(0.1)
    assert logp.grad.tolist()[0] == pytest.approx([-1.5 * s / 2, -1.5 * s / 2, 0.0], rel=1e-6)


def test_gspo_takes_token_level_advantages_from_the_first_response_token():
    logp = torch.zeros(1, 3)
    mask = torch.tensor([[0, 1, 1]])
    adv = torch.tensor([[9.0, 2.0, 2.0]])  # (B, T): the row's advantage, broadcast
    loss, _ = gspo_policy_loss(logp, logp, adv, mask)
    assert float(loss) == pytest.approx(-2.0)
    count, _ = gspo_policy_loss(logp, logp, adv, mask, normalizer=4.0)
    assert float(count) == pytest.approx(-2.0 / 4)
