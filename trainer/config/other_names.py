"""The names TRL and verl give to settings a recipe holds under other keys, for the hint an unknown
key gets (`load._explain`): a TRL or verl user's habit answered with hflow's key. `<algorithm>` is
the recipe's algorithm section (`grpo`, `ppo`, ...). The same table is the docs' migration table."""

from __future__ import annotations

# another framework's name -> (hflow's key, whose name it is[, a note])
OTHER_NAMES: dict[str, tuple[str, ...]] = {
    # TRL's GRPOConfig / TrainingArguments
    "num_generations": ("rollout.n", "TRL"),
    "max_completion_length": ("rollout.max_response_length", "TRL"),
    "max_prompt_length": ("data.max_prompt_length", "TRL"),
    "beta": ("<algorithm>.kl_coef", "TRL"),
    "epsilon": ("<algorithm>.clip_low", "TRL"),
    "epsilon_high": ("<algorithm>.clip_high", "TRL"),
    "loss_type": ("<algorithm>.loss_agg_mode", "TRL"),
    "num_iterations": ("actor.epochs", "TRL"),
    "learning_rate": ("actor.lr", "TRL"),
    "max_steps": ("trainer.total_steps", "TRL"),
    "per_device_train_batch_size": ("actor.micro_batch_size", "TRL"),
    "per_device_eval_batch_size": ("eval.batch_size", "TRL", "hflow's is the evaluation's decoding batch"),
    "save_steps": ("trainer.save_every", "TRL"),
    "max_grad_norm": ("actor.grad_clip", "TRL"),
    "warmup_steps": ("actor.warmup_steps", "TRL"),
    "lr_scheduler_type": ("actor.lr_schedule", "TRL"),
    "gradient_checkpointing": ("model.gradient_checkpointing", "TRL"),
    "use_vllm": ("rollout.engine", "TRL"),
    "model_name_or_path": ("model.path", "TRL"),
    # verl's ppo_trainer.yaml
    "max_new_tokens": ("rollout.max_response_length", "transformers"),
    "max_response_length": ("rollout.max_response_length", "verl"),
    "train_batch_size": ("trainer.prompts_per_step", "verl"),
    "ppo_mini_batch_size": ("actor.mini_batch_size", "verl", "verl counts prompts, hflow sequences"),
    "ppo_micro_batch_size_per_gpu": ("actor.micro_batch_size", "verl"),
    "log_prob_micro_batch_size_per_gpu": ("actor.score_micro_batch_size", "verl"),
    "ppo_epochs": ("actor.epochs", "verl"),
    "kl_loss_coef": ("<algorithm>.kl_coef", "verl"),
    "kl_loss_type": ("<algorithm>.kl_estimator", "verl"),
    "use_kl_loss": ("<algorithm>.kl_coef", "verl", "0 turns it off"),
    "clip_ratio": ("<algorithm>.clip_low and clip_high", "verl"),
    "clip_ratio_low": ("<algorithm>.clip_low", "verl"),
    "clip_ratio_high": ("<algorithm>.clip_high", "verl"),
    "total_training_steps": ("trainer.total_steps", "verl"),
    "total_epochs": ("trainer.total_steps", "verl", "hflow counts steps, not epochs"),
    "save_freq": ("trainer.save_every", "verl"),
    "test_freq": ("trainer.eval_every", "verl"),
    "adv_estimator": ("algorithm", "verl"),
    "train_files": ("data.train", "verl"),
    "val_files": ("data.eval", "verl"),
    "gpu_memory_utilization": ("rollout.gpu_memory_utilization", "verl"),
    "tensor_model_parallel_size": ("rollout.tensor_parallel_size", "verl"),
}


def other_name_hint(name: str, algorithm: str, accepted: list[str]) -> str | None:
    """'`name` is TRL's name; hflow's key is X' when `name` is another framework's and not a key
    accepted where it was written."""
    if name in accepted or name not in OTHER_NAMES:
        return None
    key, whose, *note = OTHER_NAMES[name]
    owner = whose + ("'" if whose.endswith("s") else "'s")
    return f"'{name}' is {owner} name; hflow's key is '{key.replace('<algorithm>', algorithm)}'" + \
        (f" ({note[0]})" if note else "")
