"""The actor's objective as a function: its parts add up as written, hand-computed."""

import math

import pytest
import torch

from hflow.engine.rlmath.objective import ActorObjective
from hflow.engine.rlmath.policy_losses import ppo_policy_loss

# Two rows; the second's last token is padding. A ratio of e^0.5 on the first token is clipped.
LOGP = torch.tensor([[-0.5, -1.0], [-2.0, -3.0]])
OLD = torch.tensor([[-1.0, -1.0], [-2.0, -3.0]])
ADV = torch.tensor([1.0, -1.0])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_without_correction_or_kl_it_is_the_named_policy_loss():
    objective = ActorObjective("ppo", (0.2, 0.2), "token-mean", horizon=2)
    loss, stats = objective(LOGP, OLD, ADV, MASK, normalizer=3.0)
    expected, _ = ppo_policy_loss(LOGP, OLD, ADV, MASK, 0.2, 0.2, normalizer=3.0)
    # per token: -1.2 (clipped), -1, +1 (A = -1, ratio 1): summed over the 3 tokens / 3
    assert float(loss) == pytest.approx((-1.2 - 1.0 + 1.0) / 3) == float(expected)
    assert set(stats) == {"pg_loss", "clipfrac", "approx_kl"} and stats["clipfrac"] == pytest.approx(1 / 3)


def test_the_kl_term_is_added_only_when_it_is_in_the_loss():
    ref = torch.tensor([[-1.5, -1.0], [-2.0, -2.0]])  # k1 per token: ref - logp negated = 1.0, 0.0, 0.0
    in_loss = ActorObjective("ppo", (0.2, 0.2), "token-mean", 2, kl_coef=0.5, kl_estimator="k1")
    loss, stats = in_loss(LOGP, OLD, ADV, MASK, 3.0, ref_log_probs=ref)
    assert float(loss) == pytest.approx((-1.2 - 1.0 + 1.0) / 3 + 0.5 * (1.0 / 3))
    assert stats["kl_loss"] == pytest.approx(1.0 / 3)
    in_reward = ActorObjective("ppo", (0.2, 0.2), "token-mean", 2, kl_coef=0.0, kl_estimator="k1")
    loss, stats = in_reward(LOGP, OLD, ADV, MASK, 3.0, ref_log_probs=ref)
    assert float(loss) == pytest.approx((-1.2 - 1.0 + 1.0) / 3) and "kl_loss" not in stats


def test_an_off_policy_correction_weighs_each_token():
    behaviour = OLD - torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])  # weight 3 on the first token, capped at 2
    objective = ActorObjective("ppo", (0.2, 0.2), "token-mean", 2, off_policy_correction="tis", off_policy_cap=2.0)
    loss, stats = objective(LOGP, OLD, ADV, MASK, 3.0, behaviour_log_probs=behaviour)
    assert float(loss) == pytest.approx((-1.2 * 2.0 - 1.0 + 1.0) / 3)
    assert stats["off_policy_weight"] == pytest.approx((2.0 + 1.0 + 1.0) / 3)


def test_what_the_loss_is_a_mean_over():
    assert ActorObjective("ppo", (0.2, 0.2), "token-mean", 2).per_token
    assert not ActorObjective("ppo", (0.2, 0.2), "seq-mean-token-mean", 2).per_token
    assert not ActorObjective("gspo", (3e-4, 4e-4), "seq-mean-token-mean", 2).per_token
