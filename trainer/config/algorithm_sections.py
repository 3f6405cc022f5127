"""The algorithms' recipe sections: `grpo`, `ppo` (also Safe-RLHF's PPO part), `remax` and
`safe_rlhf`.

The KL penalty and the PPO ratio clip are shared: `KLSection` and `ClipSection` declare
each key once, with its type and bounds; an algorithm whose default or description
differs overrides only those (the bounds travel with the `KLCoef` and `ClipBound` types).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from hflow.trainer.config.sections import Section

KLEstimator = Literal["k1", "k2", "k3", "abs"]  # engine/training/losses.py: kl_estimate
KLCoef = Annotated[float, Field(ge=0)]
ClipBound = Annotated[float, Field(ge=0)]


class KLSection(Section):
    """The KL penalty to the frozen reference policy."""

    kl_coef: KLCoef = Field(0.01, description="Weight of the KL penalty to the reference policy.")
    kl_estimator: KLEstimator = Field("k1", description="Per-token KL estimator (k1, k2, k3, abs).")


class ClipSection(Section):
    """The PPO ratio clip (Schulman et al. 2017): the ratio is kept in [1 - clip_low, 1 + clip_high]."""

    clip_low: ClipBound = Field(0.2, description="PPO ratio clip below 1 (1 - clip_low).")
    clip_high: ClipBound = Field(0.2, description="PPO ratio clip above 1 (1 + clip_high).")


class GRPOConfig(ClipSection, KLSection):
    """GRPO (Shao et al. 2024, DeepSeekMath): group-normalised scores, PPO-clip, KL in the loss."""

    kl_estimator: KLEstimator = Field(
        "k3", description="KL estimator (Schulman, 'Approximating KL divergence', 2020)."
    )
    kl_in_reward: bool = Field(
        False, description="Subtract the KL from the reward instead of adding it to the loss."
    )
    scale_by_std: bool = Field(
        True, description="Divide group-centred scores by the group std; false is Dr. GRPO."
    )
    eps: float = Field(1e-6, gt=0, description="Added to the group std before dividing.")


class PPOConfig(ClipSection, KLSection):
    """PPO (Ouyang et al. 2022, InstructGPT; Ziegler et al. 2019); also Safe-RLHF's PPO part."""

    kl_coef: KLCoef = Field(
        0.05, description="Initial weight beta of the per-token KL penalty in the reward; 0 drops the "
        "reference model."
    )
    kl_estimator: KLEstimator = Field(
        "k1", description="Per-token KL estimator (k1 = log-ratio, as Ziegler et al.; k2, k3, abs)."
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of GAE (per response token).")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda: bias (0) vs variance (1) of the advantage.")
    value_clip: Optional[float] = Field(
        0.2, gt=0, description="Clip the critic's new values to old +- value_clip in its loss; null: no clip."
    )
    kl_target: Optional[float] = Field(
        None, gt=0, description="Adaptive KL controller (Ziegler et al. 2019): the KL per sequence (nats) "
        "to track; null keeps kl_coef fixed."
    )
    kl_horizon: int = Field(10000, gt=0, description="Adaptive KL controller's horizon, in sequences.")
    whiten_advantages: bool = Field(
        True, description="Whiten the advantages over the step's response tokens (zero mean, unit variance)."
    )
    ptx_coef: float = Field(
        0.0, ge=0, description="Weight of the pretraining (PTX) language-modelling loss added to the "
        "actor's loss (InstructGPT's PPO-ptx; Safe-RLHF); needs `ppo.ptx_data`."
    )
    ptx_data: Optional[str] = Field(
        None, description="PTX text: a .jsonl or .parquet file with a `text` column; one row per rollout "
        "sequence is drawn each step."
    )
    ptx_max_length: int = Field(256, gt=0, description="PTX texts are cut to this many tokens.")

    @property
    def kl_in_reward(self) -> bool:
        """PPO always charges the KL per token in the reward (Ziegler et al. 2019); not a key."""
        return True


class ReMaxConfig(ClipSection, KLSection):
    """ReMax (Li et al. 2023, arXiv 2310.10505): REINFORCE with the greedy response's reward as baseline."""

    kl_in_reward: bool = Field(
        True, description="Charge the KL per token in the reward (the paper); false: add it to the loss."
    )
    clip_low: ClipBound = Field(
        0.2, description="PPO ratio clip below 1; matters when a step makes several updates."
    )


class SafeRLHFConfig(Section):
    """Safe-RLHF's PPO-Lagrangian (Dai et al. 2023, arXiv 2310.12773); its PPO settings are `ppo:`."""

    cost_limit: float = Field(
        0.0, description="The constraint: the mean episode cost the policy must stay below (the paper's "
        "threshold d, 0 with a cost model whose sign means unsafe)."
    )
    lambda_init: float = Field(1.0, gt=0, description="Initial Lagrange multiplier lambda.")
    lambda_lr: float = Field(0.1, gt=0, description="SGD learning rate of log(lambda).")
    lambda_max: Optional[float] = Field(None, gt=0, description="Upper bound of lambda; null: none.")
    lambda_update_delay_steps: int = Field(
        0, ge=0, description="RL steps before lambda starts to move (lets the critics warm up)."
    )
    episode_cost_window: int = Field(
        128, gt=0, description="Episode costs (one per sequence, most recent) averaged for lambda's update."
    )
