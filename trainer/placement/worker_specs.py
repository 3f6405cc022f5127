"""From a recipe to what each role's worker is told (`engine/specs.py`).

This is where the controller's choices are made once: the active algorithm's KL and clip,
each critic's initial weights, a step's mini-batch and the run's optimizer steps, and the
reward or cost function (imported here, so a bad name fails before any worker starts).
"""

from __future__ import annotations

from typing import Any

from hflow.engine.specs import (
    ActorSpec,
    CriticSpec,
    LoraSpec,
    ModelSpec,
    OptimSpec,
    ReferenceSpec,
    RolloutSpec,
    ScorerSpec,
)
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.sections import OptimConfig
from hflow.trainer.data.rewards import load_reward_fn


def optim_spec(cfg: OptimConfig, sequences_per_step: int | None = None, total_updates: int = 0) -> OptimSpec:
    """A recipe's actor or critic section, with its mini-batch resolved (default: the whole step)."""
    mini = cfg.mini_batch_size or sequences_per_step or cfg.micro_batch_size
    return OptimSpec(
        lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas), lr_schedule=cfg.lr_schedule,
        warmup_steps=cfg.warmup_steps, min_lr_ratio=cfg.min_lr_ratio, grad_clip=cfg.grad_clip,
        zero_stage=cfg.zero_stage, mini_batch_size=mini, micro_batch_size=cfg.micro_batch_size,
        micro_batch_tokens=cfg.micro_batch_tokens, score_micro_batch_size=cfg.scoring_micro_batch,
        epochs=cfg.epochs, total_updates=total_updates,
    )


def lora_spec(cfg: OptimConfig) -> LoraSpec | None:
    """The section's `lora`, or None when it trains the whole model."""
    lora = cfg.lora
    if lora is None:
        return None
    targets = lora.target_modules if isinstance(lora.target_modules, str) else tuple(lora.target_modules)
    return LoraSpec(lora.rank, lora.alpha, lora.dropout, targets)


def model_spec(recipe: Recipe, path: str) -> ModelSpec:
    """`path` loaded the way the recipe's `model` section says (dtype, remote code, checkpointing)."""
    m = recipe.model
    return ModelSpec(path, m.dtype, m.trust_remote_code, m.gradient_checkpointing)


def _trained(recipe: Recipe, section: str) -> OptimSpec:
    total = recipe.trainer.total_steps * recipe.updates_per_step(section)
    return optim_spec(getattr(recipe, section), recipe.sequences_per_step, total)


def actor_spec(recipe: Recipe) -> ActorSpec:
    r = recipe.rollout
    rollout = RolloutSpec(
        engine=r.engine, n=r.n, max_response_length=r.max_response_length, temperature=r.temperature,
        top_p=r.top_p, top_k=r.top_k, batch_size=r.batch_size, tensor_parallel_size=r.tensor_parallel_size,
        gpu_memory_utilization=r.gpu_memory_utilization, weight_bucket_mb=r.weight_bucket_mb,
        enforce_eager=r.enforce_eager, max_prompt_length=recipe.data.max_prompt_length,
        env=r.env, max_turns=r.max_turns, episode_timeout_s=r.episode_timeout_s, turn_discount=r.turn_discount,
        max_turn_tokens=r.max_turn_tokens, sandbox=recipe.tools.sandbox, sandbox_url=recipe.tools.sandbox_url,
    )
    return ActorSpec(
        model=model_spec(recipe, recipe.model.path), optim=_trained(recipe, "actor"), rollout=rollout,
        kl=recipe.kl, clip=recipe.clip, ptx_coef=recipe.ppo.ptx_coef,
        recompute_old_log_probs=recipe.actor.recompute_old_log_probs,
        offload_in_rollout=recipe.actor.offload_in_rollout, seed=recipe.seed, lora=lora_spec(recipe.actor),
        policy_loss=recipe.policy_loss, loss_agg_mode=recipe.loss_agg_mode,
        off_policy_correction=recipe.actor.off_policy_correction, off_policy_cap=recipe.actor.off_policy_cap,
    )


def critic_spec(recipe: Recipe, source: str) -> CriticSpec:
    return CriticSpec(model_spec(recipe, source), _trained(recipe, "critic"), recipe.ppo.value_clip, recipe.seed,
                      lora_spec(recipe.critic))


def reference_spec(recipe: Recipe) -> ReferenceSpec:
    path = recipe.reference.path or recipe.model.path
    return ReferenceSpec(model_spec(recipe, path), recipe.rollout.temperature, recipe.actor.scoring_micro_batch,
                         recipe.actor.zero_stage)


def scorer_spec(recipe: Recipe, section: str, local: bool = False) -> ScorerSpec:
    """The reward (`section` "reward") or Safe-RLHF's cost ("cost"): a model when set, else a function.
    `local`: on the local backend, which watches the function itself (`trainer.worker_timeout_s`);
    the ray backend's controller watches the whole call."""
    cfg = getattr(recipe, section)
    model = model_spec(recipe, cfg.model) if cfg.model else None
    fn = None if cfg.model else load_reward_fn(cfg.function, f"{section}.function", recipe.reward)
    return ScorerSpec(section, model_spec(recipe, recipe.model.path), model, fn, cfg.function,
                      recipe.actor.scoring_micro_batch, recipe.actor.zero_stage,
                      timeout_s=recipe.trainer.worker_timeout_s if local else None)


def worker_spec(recipe: Recipe, role: str, local: bool = False) -> Any:
    """The spec of one role's worker (`local`: for the local backend)."""
    builders = {
        "actor": lambda: actor_spec(recipe),
        "rollout": lambda: actor_spec(recipe),  # async mode's generator on its own pool: the actor's settings
        "reference": lambda: reference_spec(recipe),
        "critic": lambda: critic_spec(recipe, recipe.critic_source),
        "cost_critic": lambda: critic_spec(recipe, recipe.cost_critic_source),
        "reward": lambda: scorer_spec(recipe, "reward", local),
        "cost": lambda: scorer_spec(recipe, "cost", local),
    }
    return builders[role]()
