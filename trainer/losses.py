"""The RL losses, at their documented public path (docs/algorithms.md).

They are defined beside the training engine (`engine/training/losses.py`) because the
workers that compute them run inside the engine, which never imports the trainer.
"""

from hflow.engine.training.losses import (  # noqa: F401  (the public API)
    LOSS_AGG_MODES,
    OFF_POLICY_CORRECTIONS,
    POLICY_LOSSES,
    aggregate,
    behaviour_weights,
    capped_weights,
    cispo_policy_loss,
    explained_variance,
    gspo_policy_loss,
    kl_estimate,
    masked_mean,
    policy_loss,
    ppo_policy_loss,
    register_policy_loss,
    sequence_behaviour_weights,
    value_loss,
)

__all__ = ["LOSS_AGG_MODES", "OFF_POLICY_CORRECTIONS", "POLICY_LOSSES", "aggregate", "behaviour_weights",
           "capped_weights", "cispo_policy_loss", "explained_variance", "gspo_policy_loss", "kl_estimate",
           "masked_mean", "policy_loss", "ppo_policy_loss", "register_policy_loss", "sequence_behaviour_weights",
           "value_loss"]
