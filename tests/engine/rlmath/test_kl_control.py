import pytest

from hflow.engine.rlmath.kl import AdaptiveKLController, FixedKLController, kl_controller


def test_fixed_controller_keeps_its_value():
    ctl = kl_controller(0.05, None, 10000)
    assert isinstance(ctl, FixedKLController) and ctl.update(100.0, 64) == 0.05


def test_adaptive_controller_hand_computed():
    # Ziegler et al. 2019: e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon
    ctl = kl_controller(0.1, target=6.0, horizon=10000)
    assert isinstance(ctl, AdaptiveKLController)
    assert ctl.update(9.0, 1000) == pytest.approx(0.1 * 1.02)  # error 0.5 clipped to 0.2
    assert ctl.update(3.0, 1000) == pytest.approx(0.1 * 1.02 * 0.98)  # -0.5 clipped to -0.2
    assert ctl.update(6.6, 500) == pytest.approx(0.1 * 1.02 * 0.98 * (1 + 0.1 * 0.05))
    restored = kl_controller(0.1, target=6.0, horizon=10000)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value
