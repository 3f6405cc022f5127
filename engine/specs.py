"""What each worker is told: small typed settings, resolved by the controller from the recipe.

Workers never see the recipe. The controller (`trainer/placement/worker_specs.py`) makes the
choices a recipe leaves implicit -- the active algorithm's KL and clip, the critic's initial
weights, the mini-batch of a whole step, the optimizer steps of the run -- and hands each role
one of the specs below. They are plain frozen dataclasses, so they pickle to Ray workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class ModelSpec:
    """A model a worker loads: a local directory or hub id, in `dtype` (auto: bf16 on GPU, fp32 on CPU)."""

    path: str
    dtype: str = "auto"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters on a trained role's model (the recipe's `actor.lora` / `critic.lora`): rank,
    alpha (the update is scaled by alpha / rank), dropout, and the linear layers that get one
    (module-name suffixes, or "all-linear")."""

    rank: int
    alpha: float
    dropout: float
    target_modules: str | tuple[str, ...]


@dataclass(frozen=True)
class OptimSpec:
    """AdamW under DeepSpeed ZeRO for one trained role (the recipe's actor or critic section).

    mini_batch_size: sequences per optimizer step over the whole group (already resolved);
    total_updates: optimizer steps over the run (the LR schedule's length)."""

    lr: float
    weight_decay: float
    betas: tuple[float, float]
    lr_schedule: str
    warmup_steps: int
    min_lr_ratio: float
    grad_clip: float
    zero_stage: int
    mini_batch_size: int
    micro_batch_size: int
    micro_batch_tokens: Optional[int]
    score_micro_batch_size: int
    epochs: int
    total_updates: int


@dataclass(frozen=True)
class KLSettings:
    """coef: weight of the KL to the reference; estimator: k1/k2/k3/abs (`rlmath/kl.py`);
    in_reward: charged per token in the reward (true) or added to the actor's loss (false)."""

    coef: float
    estimator: str
    in_reward: bool


@dataclass(frozen=True)
class RolloutSpec:
    """How the actor samples (the recipe's `rollout` section, plus the prompt length it must hold)."""

    engine: str
    n: int
    max_response_length: int
    temperature: float
    top_p: float
    top_k: int
    batch_size: int
    tensor_parallel_size: int
    gpu_memory_utilization: float
    weight_bucket_mb: int
    enforce_eager: bool
    max_prompt_length: int
    env: str | None = None  # `module:Class` of a multi-turn environment (`engine/rollout/environment.py`)
    max_turns: int = 1
    episode_timeout_s: float = 600.0
    turn_discount: float = 1.0
    max_turn_tokens: Optional[int] = None
    sandbox: str = "bwrap"  # where model-written code runs: bwrap, http or none (`engine/rollout/code_tool.py`)
    sandbox_url: Optional[str] = None  # the SandboxFusion server's, for http


@dataclass(frozen=True)
class ActorSpec:
    """The actor: its model and optimiser, how it samples, and the policy loss's settings."""

    model: ModelSpec
    optim: OptimSpec
    rollout: RolloutSpec
    kl: KLSettings
    clip: tuple[float, float]  # PPO ratio clip (low, high)
    ptx_coef: float
    recompute_old_log_probs: bool
    offload_in_rollout: bool
    seed: int
    policy_loss: str = "ppo"  # a name in rlmath/policy_losses.py: POLICY_LOSSES
    loss_agg_mode: str = "token-mean"  # a name in rlmath/aggregation.py: AGGREGATIONS, for the policy and KL terms
    lora: Optional[LoraSpec] = None  # None: the whole model trains
    off_policy_correction: str = "none"  # a name in rlmath/off_policy.py: none, tis, decoupled
    off_policy_cap: float = 2.0


@dataclass(frozen=True)
class CriticSpec:
    """A value model (PPO's critic, Safe-RLHF's cost critic) and its clipped value loss."""

    model: ModelSpec  # its initial weights: a reward model or a causal LM
    optim: OptimSpec
    value_clip: Optional[float]
    seed: int  # seeds a new value head
    lora: Optional[LoraSpec] = None  # adapters on the backbone; the value head trains whole


@dataclass(frozen=True)
class ReferenceSpec:
    """The frozen reference policy: scores responses at the rollout's temperature. `zero_stage`:
    the actor's; at 3 the reference is partitioned over its ranks too (`training/zero3.py`)."""

    model: ModelSpec
    temperature: float
    micro_batch_size: int
    zero_stage: int = 0


@dataclass(frozen=True)
class ScorerSpec:
    """A reward or cost: a sequence-classification model, or a function (already resolved by the
    controller, so a bad name fails before any worker starts). `section` ("reward" or "cost")
    names the recipe keys in errors; `tokenizer` is the actor's, which decodes the responses."""

    section: str
    tokenizer: ModelSpec
    model: Optional[ModelSpec]
    fn: Optional[Callable[..., list]]
    function: Optional[str]
    micro_batch_size: int
    zero_stage: int = 0  # the actor's; at 3 a scoring model is partitioned over its ranks too
    timeout_s: Optional[float] = None  # the function's watchdog (local backend: trainer.worker_timeout_s)
