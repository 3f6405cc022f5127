import pytest
import torch

from hflow.engine.rlmath import advantages
from hflow.engine.rlmath.advantages import grpo


def test_grpo_hand_computed():
    # group "a": scores 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3) = 0.57735
    # group "b": scores 0.2, 0.8 -> mean 0.5, std sqrt(0.18) = 0.424264
    scores = torch.tensor([1.0, 0.0, 0.2, 0.0, 1.0, 0.8])
    ids = ["a", "a", "b", "a", "a", "b"]
    adv = grpo(scores, ids, eps=0.0)
    s3 = (1 / 3) ** 0.5
    expected = [0.5 / s3, -0.5 / s3, -0.3 / 0.18**0.5, -0.5 / s3, 0.5 / s3, 0.3 / 0.18**0.5]
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)


def test_grpo_eps_and_dr_grpo():
    scores = torch.tensor([1.0, 0.0])
    # std of (1, 0) = sqrt(0.5); with eps = 0.1 the divisor is 0.8071...
    assert grpo(scores, [0, 0], eps=0.1).tolist() == pytest.approx([0.5 / (0.5**0.5 + 0.1), -0.5 / (0.5**0.5 + 0.1)])
    assert grpo(scores, [0, 0], scale_by_std=False).tolist() == pytest.approx([0.5, -0.5])


def test_grpo_group_of_one_and_equal_scores():
    assert grpo(torch.tensor([0.7]), ["x"]).tolist() == pytest.approx([0.7])
    # identical scores in a group: no signal, advantage 0 (not NaN)
    assert grpo(torch.tensor([0.3, 0.3, 0.3]), [1, 1, 1]).tolist() == pytest.approx([0.0, 0.0, 0.0])


def test_grpo_rejects_mismatched_ids():
    with pytest.raises(ValueError):
        grpo(torch.tensor([1.0, 2.0]), [0])


# --- token rewards, GAE, ReMax, whitening -------------------------------------------------

from hflow.engine.rlmath.advantages import gae, remax, token_rewards, whiten  # noqa: E402


def test_token_rewards_kl_per_token_and_score_on_last_token():
    scores = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 9.0], [1.0, 1.0, 1.0]])
    out = token_rewards(scores, mask, kl, kl_coef=0.5)
    assert out[0].tolist() == pytest.approx([-0.05, -0.1, -0.15 + 1.0])
    assert out[1].tolist() == pytest.approx([-0.25, -0.25 + 2.0, 0.0])  # padding stays 0
    assert out[2].tolist() == [0.0, 0.0, 0.0]  # no response token: nothing to credit
    assert token_rewards(scores, mask)[0].tolist() == [0.0, 0.0, 1.0]  # without KL


def test_gae_hand_computed_with_padding_and_a_masked_middle_token():
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0], [0.0, 5.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 0.5, 9.0], [0.2, 7.0, 0.4]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1]])
    adv, ret = gae(rewards, values, mask, gamma, lam)
    # row 0: delta_2 = 1 - 0.7 = 0.3;  delta_1 = 0.9*0.7 - 0.6 = 0.03;  delta_0 = 0.9*0.6 - 0.5 = 0.04
    #        A_2 = 0.3, A_1 = 0.03 + 0.45*0.3 = 0.165, A_0 = 0.04 + 0.45*0.165 = 0.11425
    # row 1: the padded last token is skipped: delta_1 = 2 - 0.5 = 1.5, delta_0 = 0.9*0.5 - 1 = -0.55
    #        A_1 = 1.5, A_0 = -0.55 + 0.45*1.5 = 0.125
    # row 2: token 1 is masked, so token 0's next state is token 2's: delta_2 = 1 - 0.4 = 0.6,
    #        delta_0 = 0.9*0.4 - 0.2 = 0.16, A_0 = 0.16 + 0.45*0.6 = 0.43 (the masked reward 5 is ignored)
    expected_adv = [[0.11425, 0.165, 0.3], [0.125, 1.5, 0.0], [0.43, 0.0, 0.6]]
    expected_ret = [[0.61425, 0.765, 1.0], [1.125, 2.0, 0.0], [0.63, 0.0, 1.0]]
    for row in range(3):
        assert adv[row].tolist() == pytest.approx(expected_adv[row], abs=1e-6)
        assert ret[row].tolist() == pytest.approx(expected_ret[row], abs=1e-6)


def test_gae_lambda_one_gamma_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.1, -0.2, 1.0]])
    values = torch.tensor([[0.3, 0.1, 0.5]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert ret[0].tolist() == pytest.approx([0.9, 0.8, 1.0])  # Monte-Carlo returns
    assert adv[0].tolist() == pytest.approx([0.6, 0.7, 0.5])


def test_remax_hand_computed():
    rewards = torch.tensor([[-0.1, -0.2, 1.0], [-0.1, 0.5, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = remax(rewards, torch.tensor([0.4, 0.2]), mask)
    assert ret.tolist() == [pytest.approx([0.7, 0.8, 1.0]), pytest.approx([0.4, 0.5, 0.0])]
    assert adv.tolist() == [pytest.approx([0.3, 0.4, 0.6]), pytest.approx([0.2, 0.3, 0.0])]


def test_whiten_over_masked_tokens_only():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    out = whiten(values, mask, eps=0.0)
    std = (5 / 3) ** 0.5  # unbiased variance of 1, 2, 3, 4
    assert out[0].tolist() == pytest.approx([-1.5 / std, -0.5 / std, 0.5 / std])
    assert out[1].tolist() == pytest.approx([1.5 / std, 0.0, 0.0])
    assert whiten(values, mask, eps=0.0, shift_mean=False)[0, 0] == pytest.approx(-1.5 / std + 2.5)


def test_rloo_hand_computed():
    # Group a: 1, 2, 6 -> 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5
    # Group b: 0, 4    -> 0 - 4 = -4, 4 - 0 = 4
    scores = torch.tensor([1.0, 0.0, 2.0, 6.0, 4.0])
    adv = advantages.rloo(scores, ["a", "b", "a", "a", "b"])
    assert adv.tolist() == pytest.approx([-3.0, -4.0, -1.5, 4.5, 4.0])
    # k/(k-1) times the group-centred score: the identity RLOO's estimator is built on.
    assert adv[[0, 2, 3]].tolist() == pytest.approx((3 / 2 * (torch.tensor([1.0, 2.0, 6.0]) - 3.0)).tolist())


def test_rloo_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="at least 2 samples per prompt; group 'c' has 1"):
        advantages.rloo(torch.tensor([1.0, 2.0, 3.0]), ["a", "a", "c"])


def test_reinforce_plus_plus_discounted_reward_to_go_then_whitened():
    # Row 0: rewards [1, 0, 2] on 3 tokens, gamma 0.5 -> returns [1 + 0.5*(0 + 0.5*2), 0 + 0.5*2, 2]
    #        = [1.5, 1.0, 2.0]. Row 1: [3, pad] -> [3.0, 0 (masked)].
    rewards = torch.tensor([[1.0, 0.0, 2.0], [3.0, 5.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv, returns = advantages.reinforce_plus_plus(rewards, mask, gamma=0.5)
    assert returns.flatten().tolist() == pytest.approx([1.5, 1.0, 2.0, 3.0, 0.0, 0.0])
    valid = torch.tensor([1.5, 1.0, 2.0, 3.0])
    mean, std = valid.mean(), valid.std()  # over the batch's 4 response tokens, unbiased
    expected = ((valid - mean) / std).tolist()
    assert [adv[0, 0], adv[0, 1], adv[0, 2], adv[1, 0]] == pytest.approx(expected, rel=1e-5)
    assert adv[1, 1:].tolist() == [0.0, 0.0]


def test_reinforce_plus_plus_gamma_one_with_kl_in_the_token_rewards():
    # token_rewards charges -0.1 * kl per token and the score 1.0 on the last: [-0.1, -0.2, 1 - 0.3].
    mask = torch.tensor([[1, 1, 1]])
    rewards = advantages.token_rewards(torch.tensor([1.0]), mask, torch.tensor([[1.0, 2.0, 3.0]]), 0.1)
    _, returns = advantages.reinforce_plus_plus(rewards, mask)
    assert returns.tolist()[0] == pytest.approx([0.4, 0.5, 0.7])


def test_reinforce_plus_plus_baseline_group_mean_then_whitened_over_tokens():
    # Group a: 1, 3 -> centred -1, +1; group b: 5, 5, 8 -> -1, -1, +2. Rows have 2, 1, 1, 2, 1 tokens.
    scores = torch.tensor([1.0, 5.0, 3.0, 5.0, 8.0])
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1], [1, 0]])
    adv = advantages.reinforce_plus_plus_baseline(scores, ["a", "b", "a", "b", "b"], mask)
    tokens = torch.tensor([-1.0, -1.0, -1.0, 1.0, -1.0, -1.0, 2.0])  # row by row, response tokens only
    expected = (tokens - tokens.mean()) / tokens.std()
    got = torch.cat([adv[0], adv[1, :1], adv[2, :1], adv[3], adv[4, :1]])
    assert got.tolist() == pytest.approx(expected.tolist(), rel=1e-5)
    assert adv[1, 1] == 0.0 and adv[2, 1] == 0.0
