import math

import pytest
import torch

from hflow.engine.rlmath.aggregation import masked_mean
from hflow.engine.rlmath.kl import kl_estimate
from hflow.engine.rlmath.policy_losses import POLICY_LOSSES, cispo_policy_loss, policy_loss, ppo_policy_loss


def test_ppo_policy_loss_hand_computed():
    # Token ratios r = exp(logp - old): 1.5, 0.5, 1.1, and a padded token.
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 9.0]]))
    adv = torch.tensor([[1.0, 1.0, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = ppo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    # token 1: A=1,  r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped)
    # token 2: A=1,  r=0.5 -> max(-0.5, -0.8) = -0.5 (unclipped, ratio below the range still counts)
    # token 3: A=-2, r=1.1 -> max(2.2, 2.2)   = 2.2
    assert float(loss) == pytest.approx((-1.2 - 0.5 + 2.2) / 3, rel=1e-6)
    assert metrics["clipfrac"] == pytest.approx(1 / 3)
    assert metrics["approx_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(1.1)) / 3, rel=1e-6)


def test_ppo_policy_loss_sequence_advantages_and_normalizer():
    logp = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])  # (B,) broadcast over tokens
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, _ = ppo_policy_loss(logp, logp, adv, mask)
    assert float(loss) == pytest.approx((-1 - 1 + 1) / 3)
    summed, _ = ppo_policy_loss(logp, logp, adv, mask, normalizer=10.0)
    assert float(summed) == pytest.approx(-1 / 10)


def test_asymmetric_clip():
    old = torch.zeros(1, 1)
    logp = torch.log(torch.tensor([[1.5]]))
    loss, _ = ppo_policy_loss(logp, old, torch.ones(1, 1), torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
    assert float(loss) == pytest.approx(-1.28)


def test_kl_estimators_hand_computed():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    d = [math.log(0.5), math.log(2.0)]  # ref - logp
    assert kl_estimate(logp, ref, "k1")[0].tolist() == pytest.approx([-d[0], -d[1]])
    assert kl_estimate(logp, ref, "k2")[0].tolist() == pytest.approx([d[0] ** 2 / 2, d[1] ** 2 / 2])
    assert kl_estimate(logp, ref, "k3")[0].tolist() == pytest.approx([math.exp(x) - x - 1 for x in d])
    assert kl_estimate(logp, ref, "abs")[0].tolist() == pytest.approx([abs(x) for x in d])
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k9")


def test_masked_mean_ignores_padding():
    assert float(masked_mean(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1, 1, 0]]))) == 2.0


def test_value_loss_clipped_hand_computed():
    from hflow.engine.rlmath.value import value_loss

    values = torch.tensor([[1.0, 2.0, 0.0, 1.0, 5.0]])
    old = torch.tensor([[0.5, 2.5, 0.0, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.3, 0.6, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, clip=0.2)
    # token 0: v' = 0.5 + 0.2 = 0.7: max((1 - 2)^2, (0.7 - 2)^2) = 1.69 (clipped term larger)
    # token 1: v' = 2.5 - 0.2 = 2.3: max((2 - 1)^2, (2.3 - 1)^2) = 1.69 (clipped term larger)
    # token 2: v = old: 0.09 either way
    # token 3: v' = 0.7: max((1 - 0.6)^2, (0.7 - 0.6)^2) = 0.16 (unclipped larger)
    assert float(loss) == pytest.approx(0.5 * (1.69 + 1.69 + 0.09 + 0.16) / 4, rel=1e-6)
    assert metrics["clipfrac"] == pytest.approx(2 / 4)
    plain, _ = value_loss(values, old, returns, mask, clip=None)
    assert float(plain) == pytest.approx(0.5 * (1 + 1 + 0.09 + 0.16) / 4, rel=1e-6)
    shared, _ = value_loss(values, old, returns, mask, clip=0.2, normalizer=8.0)
    assert float(shared) == pytest.approx(0.5 * (1.69 + 1.69 + 0.09 + 0.16) / 8, rel=1e-6)


def test_explained_variance_hand_computed():
    from hflow.engine.rlmath.value import explained_variance

    values = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    returns = torch.tensor([[1.0, 2.0, 4.0, -50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # Var(returns) = 14/9, Var(returns - values) = Var(0, 0, 1) = 2/9  ->  1 - 1/7
    assert explained_variance(values, returns, mask) == pytest.approx(6 / 7)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)


def test_cispo_hand_computed():
    """r = exp(logp - old) = (e^0.5, e^-0.5, 1); the weight clip(r, 1 - 1.0, 1 + 0.28) caps only the
    first at 1.28. Per token -w * A * logp with A = 2: (2.56, 2.42612, 1.0), token-mean 1.99537;
    the gradient is -w * A / 3 on every token, the clipped one included."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.5, -0.5]])
    loss, stats = cispo_policy_loss(logp, old, torch.tensor([2.0]), torch.ones(1, 3), clip_low=1.0, clip_high=0.28)
    assert float(loss.detach()) == pytest.approx((2.56 + 4 * math.exp(-0.5) + 1.0) / 3, abs=1e-6)
    loss.backward()
    expected = [-1.28 * 2 / 3, -math.exp(-0.5) * 2 / 3, -2 / 3]
    assert logp.grad[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert stats["clipfrac"] == pytest.approx(1 / 3)
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_cispo_keeps_the_gradient_ppo_clips_away():
    """A token whose ratio passed PPO's clip (with a positive advantage) gets no gradient from PPO;
    CISPO's still pushes it, with the capped weight."""
    logp = torch.tensor([[-1.0]], requires_grad=True)
    old, adv, mask = torch.tensor([[-1.5]]), torch.tensor([1.0]), torch.ones(1, 1)
    ppo_policy_loss(logp, old, adv, mask, 0.2, 0.2)[0].backward()
    assert float(logp.grad) == 0.0
    logp.grad = None
    cispo_policy_loss(logp, old, adv, mask, 0.2, 0.2)[0].backward()
    assert float(logp.grad) == pytest.approx(-1.2)  # the weight e^0.5 capped at 1.2, times A = 1


def test_the_schema_offers_exactly_the_registered_policy_losses():
    import typing

    from hflow.trainer.config.algorithm_sections import PolicyLossName

    assert typing.get_args(PolicyLossName) == tuple(POLICY_LOSSES)
    assert [policy_loss(n).per_sequence for n in POLICY_LOSSES] == [False, True, False]
    with pytest.raises(ValueError, match="accepted: ppo, gspo, cispo"):
        policy_loss("grpo")
