"""The algorithms: each one's recipe section, declared with its row (`@algorithm`: roles, trained
sections, program, the modes its loop supports) and what it needs of the rest of the recipe
(`check`). The `Recipe` gets one section per declared algorithm, named after it, and accepts
exactly these names as `algorithm`: a new algorithm is its loop file (`trainer/algorithms/`), its
math (`engine/rlmath/`) and one decorated section here.

The KL penalty and the policy loss (PPO ratio clip, loss aggregation) are shared:
`KLSection` and `ClipSection` declare each key once, with its type and bounds; an algorithm whose default or description
differs overrides only those (the bounds travel with the `KLCoef` and `ClipBound` types).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from hflow.engine.rlmath.aggregation import AGGREGATIONS
from hflow.engine.rlmath.kl import KL_ESTIMATORS
from hflow.engine.rlmath.policy_losses import POLICY_LOSSES
from hflow.trainer.config.sections import Section
from hflow.trainer.roles import Algorithm

# The names the RL math registers (engine/rlmath/): a recipe accepts exactly those.
KLEstimator = Literal[KL_ESTIMATORS.names()]
LossAggMode = Literal[AGGREGATIONS.names()]  # verl's `loss_agg_mode` names
PolicyLossName = Literal[POLICY_LOSSES.names()]
KLCoef = Annotated[float, Field(ge=0)]
ClipBound = Annotated[float, Field(ge=0)]

# The declared algorithms by name, and each one's recipe section (filled by `@algorithm` below).
ALGORITHMS: dict[str, Algorithm] = {}
SECTIONS: dict[str, type[Section]] = {}
_PROGRAMS = "hflow.trainer.algorithms."
# Why PPO's loop does not run in `trainer.mode: async` (the others say why at their declaration).
_CRITIC_NOT_ASYNC = "its critic trains on the same rollouts and the value targets would go stale with them"


def algorithm(name: str, roles: tuple[str, ...], description: str, trained: tuple[str, ...] = ("actor",),
              settings: str | None = None, program: str | None = None, no_async: str | None = None,
              streams_updates: bool = False):
    """Class decorator: declare the algorithm `name`, whose recipe section is the decorated class
    (see `roles.Algorithm` for the rest)."""
    def declare(section: type[Section]) -> type[Section]:
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is declared twice")
        ALGORITHMS[name] = Algorithm(name, roles, trained, settings or name, _PROGRAMS + (program or name),
                                     description, no_async, streams_updates)
        SECTIONS[name] = section
        return section
    return declare


def needs_group(recipe, reason: str) -> None:
    """The active algorithm compares the n samples of a prompt: refuse rollout.n < 2, saying why."""
    if recipe.rollout.n < 2:
        raise ValueError(f"algorithm {recipe.algorithm} with rollout.n={recipe.rollout.n}: {reason}; "
                         "set rollout.n to 2 or more")


class KLSection(Section):
    """The KL penalty to the frozen reference policy."""

    kl_coef: KLCoef = Field(0.01, description="Weight of the KL penalty to the reference policy.")
    kl_estimator: KLEstimator = Field("k1", description="Per-token KL estimator (k1, k2, k3, abs).")


class ClipSection(Section):
    """The actor's policy loss and its ratio clip (Schulman et al. 2017): the ratio is kept in
    [1 - clip_low, 1 + clip_high]."""

    policy_loss: PolicyLossName = Field(
        "ppo", description="The actor's surrogate: ppo (PPO's clipped per-token ratio), gspo (a clipped "
        "sequence-level ratio; Zheng et al. 2025, arXiv 2507.18071), cispo (REINFORCE on every token with "
        "a clipped, stop-gradient importance weight; MiniMax-M1, arXiv 2506.13585)."
    )
    clip_low: ClipBound = Field(0.2, description="Ratio clip below 1 (1 - clip_low); cispo: of the weight.")
    clip_high: ClipBound = Field(0.2, description="Ratio clip above 1 (1 + clip_high); cispo: of the weight.")
    loss_agg_mode: LossAggMode = Field(
        "token-mean", description="How the actor's per-token losses become one: token-mean (every token "
        "weighs the same; DAPO), seq-mean-token-mean (every sequence; the original GRPO), seq-mean-token-sum, "
        "seq-mean-token-sum-norm (token sums over rollout.max_response_length; Dr. GRPO)."
    )

    def check(self, recipe) -> None:
        if self.policy_loss == "gspo" and self.loss_agg_mode != "seq-mean-token-mean":
            section = recipe.algorithm_spec.settings
            raise ValueError(f"{section}.loss_agg_mode={self.loss_agg_mode} is not defined for "
                             f"{section}.policy_loss gspo, whose loss is one term per sequence; "
                             "accepted: seq-mean-token-mean")


@algorithm("grpo", ("actor", "reward"), "GRPO's loss and advantage.", streams_updates=True)
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


@algorithm("ppo", ("actor", "critic", "reward"), "PPO's advantage, losses and KL (also Safe-RLHF's).",
           trained=("actor", "critic"), no_async=_CRITIC_NOT_ASYNC)
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


@algorithm("remax", ("actor", "reward"), "ReMax's KL and clip.",
           no_async="its greedy baseline must come from the policy being trained")
class ReMaxConfig(ClipSection, KLSection):
    """ReMax (Li et al. 2023, arXiv 2310.10505): REINFORCE with the greedy response's reward as baseline."""

    kl_in_reward: bool = Field(
        True, description="Charge the KL per token in the reward (the paper); false: add it to the loss."
    )
    clip_low: ClipBound = Field(
        0.2, description="PPO ratio clip below 1; matters when a step makes several updates."
    )


@algorithm("safe_rlhf", ("actor", "critic", "cost_critic", "reward", "cost"), "Safe-RLHF's Lagrange multiplier.",
           trained=("actor", "critic"), settings="ppo",
           no_async="its critics and Lagrange multiplier train on the same rollouts")
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


@algorithm("rloo", ("actor", "reward"), "RLOO's KL and clip.", streams_updates=True)
class RLOOConfig(ClipSection, KLSection):
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): each sample's baseline is the mean reward of
    the other samples of its prompt (needs rollout.n >= 2)."""

    kl_coef: KLCoef = Field(0.05, description="Weight of the KL penalty to the reference policy.")
    kl_in_reward: bool = Field(
        True, description="Subtract the summed KL from each sequence's reward (as the paper and TRL); "
        "false: add it to the loss."
    )

    def check(self, recipe) -> None:
        super().check(recipe)
        needs_group(recipe, "its baseline is the other samples of the prompt")


@algorithm("reinforce_pp", ("actor", "reward"), "REINFORCE++'s KL and clip.")
class ReinforcePPConfig(ClipSection, KLSection):
    """REINFORCE++ (Hu et al. 2025, arXiv 2501.03262): per-token KL in the reward, reward-to-go,
    advantages whitened over the batch. No critic."""

    kl_coef: KLCoef = Field(0.01, description="Weight beta of the per-token KL penalty in the reward.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount of the reward-to-go (per response token).")

    @property
    def kl_in_reward(self) -> bool:
        """REINFORCE++ charges the KL per token in the reward (the paper); not a key."""
        return True


@algorithm("reinforce_pp_baseline", ("actor", "reward"), "REINFORCE++-baseline's KL and clip.",
           program="reinforce_pp")
class ReinforcePPBaselineConfig(ClipSection, KLSection):
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262, v3+): the prompt's mean reward as
    baseline, advantages whitened over the batch, the KL in the loss."""

    kl_estimator: KLEstimator = Field(
        "k2", description="KL estimator of the KL loss (k2, as the paper recommends; k1, k3, abs)."
    )

    @property
    def kl_in_reward(self) -> bool:
        """REINFORCE++-baseline adds the KL to the loss (the paper); not a key."""
        return False

    def check(self, recipe) -> None:
        super().check(recipe)
        needs_group(recipe, "its baseline is the prompt's mean reward")


@algorithm("dapo", ("actor", "reward"), "DAPO's clip, sampling and reward shaping.",
           no_async="dynamic sampling draws extra rounds at the current policy until the step is full")
class DAPOConfig(GRPOConfig):
    """DAPO (Yu et al. 2025, arXiv 2503.14476): GRPO with clip-higher, a token-mean loss, dynamic
    sampling and overlong reward shaping, and no KL by default."""

    kl_coef: KLCoef = Field(0.0, description="Weight of the KL penalty to the reference policy (DAPO: none).")
    clip_high: ClipBound = Field(0.28, description="Clip-higher: the ratio clip above 1 (DAPO: 0.28).")
    dynamic_sampling: bool = Field(
        True, description="Drop prompts whose n rewards are all equal and sample more prompts until the "
        "step has trainer.prompts_per_step varied groups (needs rollout.n >= 2)."
    )
    max_sampling_rounds: int = Field(
        4, ge=1, description="Most generation rounds per step for dynamic sampling; when they are spent the "
        "step is filled up with dropped groups (zero advantage) and dapo/filled_groups says how many."
    )
    overlong_buffer: int = Field(
        0, ge=0, description="Soft overlong punishment: responses longer than rollout.max_response_length "
        "minus this many tokens lose reward linearly, up to overlong_penalty at the maximum; 0: off."
    )
    overlong_penalty: float = Field(1.0, ge=0, description="Reward lost by a response of the maximum length.")

    def check(self, recipe) -> None:
        super().check(recipe)
        if self.dynamic_sampling:
            needs_group(recipe, "dynamic sampling drops prompts whose n rewards are all equal")
        longest = recipe.rollout.max_response_length
        if self.overlong_buffer >= longest:
            raise ValueError(f"dapo.overlong_buffer={self.overlong_buffer} must be below "
                             f"rollout.max_response_length={longest} (the penalty ramps over the last "
                             "overlong_buffer tokens); 0 turns it off")


@algorithm("gspo", ("actor", "reward"), "GSPO's sequence-level clip.", program="grpo",
           streams_updates=True)  # GRPO's loop, GSPO's loss
class GSPOConfig(GRPOConfig):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): GRPO's advantages with a clipped sequence-level
    importance ratio (the per-token log-ratio's mean over the response, exponentiated)."""

    kl_coef: KLCoef = Field(0.0, description="Weight of the KL penalty to the reference policy (GSPO: none).")
    policy_loss: PolicyLossName = Field("gspo", description="GSPO's sequence-level ratio (`grpo.policy_loss`).")
    clip_low: ClipBound = Field(3e-4, description="Sequence ratio clip below 1 (the paper: 3e-4).")
    clip_high: ClipBound = Field(4e-4, description="Sequence ratio clip above 1 (the paper: 4e-4).")
    loss_agg_mode: LossAggMode = Field(
        "seq-mean-token-mean", description="GSPO's loss is one term per sequence: only seq-mean-token-mean "
        "(the mean over sequences) is defined."
    )

