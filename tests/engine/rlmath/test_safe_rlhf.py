"""Safe-RLHF's math: the Lagrange multiplier's update and the combined advantage."""

import math

import pytest
import torch

from hflow.engine.rlmath.safe_rlhf import Lagrangian, combine_advantages


def test_lagrangian_sgd_step_on_log_lambda():
    lag = Lagrangian(lambda_init=1.0, lambda_lr=0.1, lambda_max=None, cost_limit=0.5)
    # loss -(Jc - d) * lambda; d/dlog_lambda = -(Jc - d) * lambda; SGD: log_lambda += lr * (Jc - d) * lambda
    assert lag.update(1.5) == pytest.approx(math.exp(0.1))  # cost above the limit: lambda grows
    assert lag.update(0.0) == pytest.approx(math.exp(0.1 - 0.1 * 0.5 * math.exp(0.1)))  # below: shrinks
    assert lag.value == pytest.approx(math.exp(lag.log_lambda))


def test_lagrangian_cap_delay_and_window():
    capped = Lagrangian(1.0, 0.1, lambda_max=1.05, cost_limit=0.5)
    assert capped.update(1.5) == pytest.approx(1.05)
    lag = Lagrangian(1.0, 0.1, cost_limit=0.5, window=4, delay_steps=2)
    assert lag.step([1.0, 1.0], step=1) == 1.0  # delayed: no update in the first 2 steps
    assert lag.step([0.0, 0.0], step=2) == 1.0
    assert lag.step([3.0, 3.0], step=3) == pytest.approx(math.exp(0.1 * (1.5 - 0.5)))  # window 0, 0, 3, 3
    assert lag.window_mean == 1.5


def test_lagrangian_state_round_trip():
    lag = Lagrangian(2.0, 0.05, cost_limit=0.1, window=3)
    lag.step([0.3, 0.9], 1)
    copy = Lagrangian(2.0, 0.05, cost_limit=0.1, window=3)
    copy.load_state_dict(lag.state_dict())
    assert copy.step([0.2], 2) == lag.step([0.2], 2)
    assert list(copy.costs) == [0.3, 0.9, 0.2]


def test_combine_advantages():
    out = combine_advantages(torch.tensor([1.0, -2.0]), torch.tensor([0.5, 1.0]), 3.0)
    assert out.tolist() == pytest.approx([(1 - 1.5) / 4, (-2 - 3) / 4])
