"""Off-policy corrections of the policy loss (asynchronous rollout), hand-computed."""

import math

import pytest
import torch

from hflow.engine.rlmath.off_policy import behaviour_weights, capped_weights, sequence_behaviour_weights
from hflow.engine.rlmath.policy_losses import gspo_policy_loss, ppo_policy_loss


def test_tis_truncates_and_decoupled_drops_the_tokens_past_the_cap():
    # ratios pi_prox / pi_behav of 0.5, 1.0, 3.0 with cap 2
    prox = torch.log(torch.tensor([[0.5, 1.0, 3.0]]))
    behav = torch.zeros(1, 3)
    assert behaviour_weights(prox, behav, 2.0, "tis")[0].tolist() == pytest.approx([0.5, 1.0, 2.0])
    assert behaviour_weights(prox, behav, 2.0, "decoupled")[0].tolist() == pytest.approx([0.5, 1.0, 0.0])
    assert behaviour_weights(prox, behav, 2.0, "none").tolist() == [[1.0, 1.0, 1.0]]


def test_weights_carry_no_gradient_and_never_overflow():
    log_weights = torch.tensor([1000.0, 0.0], requires_grad=True)
    weights = capped_weights(log_weights, 5.0, "tis")
    assert not weights.requires_grad
    assert weights.tolist() == [5.0, 1.0]
    with pytest.raises(ValueError, match="accepted: none, tis, decoupled"):
        capped_weights(log_weights, 5.0, "clip")


def test_ppo_loss_with_behaviour_weights_hand_computed():
    # Two tokens, A = 1, new = old (r = 1, no clipping): per token -A * r * w = -w.
    logp = torch.zeros(1, 2)
    adv = torch.ones(1)
    mask = torch.ones(1, 2)
    w = behaviour_weights(torch.log(torch.tensor([[0.5, 4.0]])), torch.zeros(1, 2), 2.0, "tis")  # 0.5, 2.0
    loss, _ = ppo_policy_loss(logp, logp, adv, mask, weights=w)
    assert float(loss) == pytest.approx(-(0.5 + 2.0) / 2)
    # decoupled: the second token (weight 4 > cap 2) is left out of the sum, still counted in the mean
    w = behaviour_weights(torch.log(torch.tensor([[0.5, 4.0]])), torch.zeros(1, 2), 2.0, "decoupled")
    loss, _ = ppo_policy_loss(logp, logp, adv, mask, weights=w)
    assert float(loss) == pytest.approx(-0.5 / 2)
    # weights of one change nothing
    plain, _ = ppo_policy_loss(logp + 0.1, logp, adv, mask)
    ones, _ = ppo_policy_loss(logp + 0.1, logp, adv, mask, weights=torch.ones(1, 2))
    assert float(plain) == float(ones)


def test_ppo_clip_is_against_the_proximal_policy_and_the_weight_scales_it():
    # r = exp(0.5) = 1.6487 > 1 + 0.2 with A = 1: the clipped term -1.2 wins; weight 1.5 -> -1.8.
    loss, metrics = ppo_policy_loss(torch.tensor([[0.5]]), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1),
                                    weights=torch.tensor([[1.5]]))
    assert float(loss) == pytest.approx(-1.2 * 1.5)
    assert metrics["clipfrac"] == 1.0


def test_sequence_weights_are_the_capped_geometric_mean_for_gspo():
    # tokens with log-ratios log 2 and log 8 (the third is padding): geometric mean 4, cap 3
    prox = torch.tensor([[math.log(2.0), math.log(8.0), 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert sequence_behaviour_weights(prox, torch.zeros(1, 3), mask, 10.0, "tis").tolist() == pytest.approx([4.0])
    assert sequence_behaviour_weights(prox, torch.zeros(1, 3), mask, 3.0, "tis").tolist() == pytest.approx([3.0])
    assert sequence_behaviour_weights(prox, torch.zeros(1, 3), mask, 3.0, "decoupled").tolist() == [0.0]
    logp = torch.zeros(1, 3)
    loss, _ = gspo_policy_loss(logp, logp, torch.tensor([2.0]), mask, weights=torch.tensor([0.25]))
    assert float(loss) == pytest.approx(-2.0 * 0.25)
