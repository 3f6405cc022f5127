"""The recipe schema: every key a recipe may set, its default and its meaning, in one place.

The sections live in `sections.py`, `run_sections.py` and `algorithm_sections.py`; the
`Recipe` here puts them together (one section per declared algorithm, `@algorithm`) and checks
what spans sections. A YAML recipe only overrides these
defaults; `--set a.b=c` and `HFLOW_A__B=c` environment variables override the YAML (see
`load.py`). An unknown key is an error, never silently ignored (STYLE.md, rule 4).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hflow.engine.specs import KLSettings
from hflow.trainer.config.algorithm_sections import ALGORITHMS, SECTIONS
from hflow.trainer.config.eval_section import EvalConfig
from hflow.trainer.config.run_sections import (
    ClusterConfig,
    LoggingConfig,
    PlacementConfig,
    TrainerConfig,
)
from hflow.trainer.config.sections import (
    ActorConfig,
    CostConfig,
    CriticConfig,
    DataConfig,
    ModelConfig,
    ReferenceConfig,
    RewardConfig,
    RolloutConfig,
)
from hflow.trainer.config.tools_section import ToolsConfig
from hflow.trainer.roles import Algorithm

# Where each role's model comes from: the first of these keys that is set. The reference falls
# back to the actor; the critic to the reward model, then the actor (as safe-rlhf and OpenRLHF
# initialise critics); the cost critic to the cost model, then the critic's. A role without a
# key set (reward and cost given as functions) runs no model.
MODEL_KEYS = {
    "actor": ("model.path",),
    "reference": ("reference.path", "model.path"),
    "critic": ("critic.path", "reward.model", "model.path"),
    "reward": ("reward.model",),
    "cost_critic": ("cost.critic_path", "cost.model", "critic.path", "reward.model", "model.path"),
    "cost": ("cost.model",),
}


# trainer.mode async runs the critic-free outcome loop (`grpo.run_outcome_loop`); trainer.stream_updates
# trains a mini-batch before the step is whole. Which algorithms can: their rows say (`roles.Algorithm`).
ASYNC_ALGORITHMS = tuple(a.name for a in ALGORITHMS.values() if a.no_async is None)
STREAM_UPDATE_ALGORITHMS = tuple(a.name for a in ALGORITHMS.values() if a.streams_updates)


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot name a run directory, or None: it must be one path component, so that the
    run directory lands inside `trainer.output_dir` (`../../x` or `/tmp/x` would not)."""
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        return "a run name is one folder name (no '/', '\\', '.' or '..'), e.g. ppo-qwen2.5-7b"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "a run name may not hold control characters"
    if len(name.encode()) > 200:
        return "a run name is at most 200 bytes (the run directory adds a date to it)"
    return None


class RecipeSections(BaseSettings):
    """The recipe's sections other than the algorithms', and every check that spans sections; the
    `Recipe` below adds one section per declared algorithm."""

    model_config = SettingsConfigDict(
        extra="forbid",
        env_prefix="HFLOW_",
        env_nested_delimiter="__",
        validate_assignment=True,
        protected_namespaces=(),
    )

    name: Optional[str] = Field(
        None, description="Run name prefix (one folder name: the run directory is `trainer.output_dir`/"
        "NAME-DATE); default: the recipe file's name."
    )
    algorithm: Literal[tuple(ALGORITHMS)] = Field("grpo", description="The RL algorithm (docs/algorithms.md).")
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
    tools: ToolsConfig = Field(default_factory=ToolsConfig, description="Where model-written code runs.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Actor optimisation.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="The run loop.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation: sampling and held-out sets.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="What is logged where.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="The devices to run on.")
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig, description="Which roles share devices."
    )

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, value: Optional[str]) -> Optional[str]:
        problem = value is not None and run_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check_batch_sizes(self) -> "Recipe":
        sequences = self.trainer.prompts_per_step * self.rollout.n
        for section in self.algorithm_spec.trained:
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
        if "cost" in self.algorithm_spec.roles and not (self.cost.model or self.cost.function):
            raise ValueError(f"algorithm {self.algorithm} needs a cost: set cost.model (a cost model directory) "
                             "or cost.function (e.g. synthetic_cost)")
        if self.trainer.eval_every and not (self.data.eval or self.eval.sets):
            raise ValueError("trainer.eval_every > 0 needs data.eval (a .jsonl or .parquet file, or "
                             "synthetic:TASK for a task's held-out problems) or eval.sets")
        if self.ppo.ptx_coef > 0 and not self.ppo.ptx_data:
            raise ValueError("ppo.ptx_coef > 0 needs ppo.ptx_data (a .jsonl or .parquet file with a text column)")
        return self

    @model_validator(mode="after")
    def _check_algorithm(self) -> "Recipe":
        """What the active algorithm's sections need of the rest of the recipe (their `check`)."""
        for section in dict.fromkeys((self.algorithm, self.algorithm_spec.settings)):
            getattr(self, section).check(self)
        return self

    @model_validator(mode="after")
    def _check_rollout_engine(self) -> "Recipe":
        """Combinations the generation engines cannot run (the environment is checked at start-up:
        `control/preflight.py`)."""
        r = self.rollout
        if self.reward.function == "env" and not self.reward.model and not r.env:
            raise ValueError("reward.function env scores an episode's return: it needs rollout.env (module:Class)")
        if r.engine == "hf":
            if r.tensor_parallel_size > 1:
                raise ValueError(f"rollout.tensor_parallel_size={r.tensor_parallel_size} needs rollout.engine: vllm "
                                 "(the hf engine generates on each rank's own copy of the model); set it to 1")
            return self
        if r.env and r.tensor_parallel_size > 1:
            raise ValueError(f"rollout.env {r.env!r} with rollout.tensor_parallel_size={r.tensor_parallel_size} is "
                             "not supported: a tensor-parallel group must generate identical requests, and its "
                             "ranks' episodes end after different turns; set rollout.tensor_parallel_size: 1")
        if not self.actor.recompute_old_log_probs:
            raise ValueError("rollout.engine vllm needs actor.recompute_old_log_probs: true (vLLM reports no "
                             "per-token entropy, and its log-probs come from different kernels than training's)")
        return self

    @model_validator(mode="after")
    def _check_sandbox(self) -> "Recipe":
        """`tools.sandbox: http` and `tools.sandbox_url` go together."""
        kind, url = self.tools.sandbox, self.tools.sandbox_url
        if kind == "http" and not url:
            raise ValueError("tools.sandbox http sends model-written code to a SandboxFusion server: set "
                             "tools.sandbox_url (e.g. http://sandbox:8080)")
        if url and kind != "http":
            raise ValueError(f"tools.sandbox_url {url!r} is used by tools.sandbox http only (it is {kind}); "
                             "set tools.sandbox: http or drop the URL")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"tools.sandbox_url {url!r}: an http:// or https:// URL, e.g. http://sandbox:8080")
        return self

    @model_validator(mode="after")
    def _check_stream(self) -> "Recipe":
        """What `rollout.stream_prompts` runs with (see `trainer/streaming/chunks.py`)."""
        chunk, per_step = self.rollout.stream_prompts, self.trainer.prompts_per_step
        if not chunk:
            return self
        if self.algorithm not in ASYNC_ALGORITHMS:
            raise ValueError(f"rollout.stream_prompts streams the loop of {', '.join(ASYNC_ALGORITHMS)}, not "
                             f"algorithm {self.algorithm}; set rollout.stream_prompts: 0")
        if per_step % chunk:
            raise ValueError(f"rollout.stream_prompts={chunk} does not divide trainer.prompts_per_step={per_step}; "
                             f"use a divisor of {per_step} (0: no streaming)")
        return self

    @model_validator(mode="after")
    def _check_async(self) -> "Recipe":
        """What `trainer.mode: async` runs with (see `trainer/streaming/async_rollout.py`)."""
        if self.actor.off_policy_correction != "none" and not self.actor.recompute_old_log_probs:
            raise ValueError(f"actor.off_policy_correction={self.actor.off_policy_correction} needs "
                             "actor.recompute_old_log_probs: true (its weight is the old log-probs over the sampler's)")
        if self.trainer.mode == "sync":
            return self
        if self.algorithm not in ASYNC_ALGORITHMS:
            reason = self.algorithm_spec.no_async
            raise ValueError(f"trainer.mode async does not run algorithm {self.algorithm}: {reason}; use "
                             f"trainer.mode: sync, or one of {', '.join(ASYNC_ALGORITHMS)}")
        if self.rollout.engine == "vllm" and self.placement.backend == "local":
            raise ValueError("trainer.mode async with rollout.engine vllm generates on a pool of its own: set "
                             "placement.backend: ray with placement.mode split (or rollout.engine: hf, whose "
                             "generator copy also runs in one process)")
        if self.rollout.engine == "vllm" and self.rollout.tensor_parallel_size > 1:
            raise ValueError(f"trainer.mode async runs the vllm rollout with tensor_parallel_size 1 only (got "
                             f"{self.rollout.tensor_parallel_size}); set rollout.tensor_parallel_size: 1")
        if self.rollout.env:
            raise ValueError(f"trainer.mode async runs single-turn rollouts only (its generator copy has no episode "
                             f"loop); drop rollout.env {self.rollout.env!r} or set trainer.mode: sync")
        if self.placement.backend == "ray" and self.placement.mode == "colocate":
            raise ValueError("trainer.mode async on the ray backend generates on a pool of its own, but "
                             "placement.mode colocate puts every role on one pool; use placement.mode split or "
                             "standalone, or explicit with rollout on a pool of its own (or placement.backend: local)")
        return self

    @model_validator(mode="after")
    def _check_stream_updates(self) -> "Recipe":
        """What `trainer.stream_updates` runs with (see `trainer/streaming/streamed_update.py`)."""
        if not self.trainer.stream_updates:
            return self
        if self.trainer.mode != "async":
            raise ValueError("trainer.stream_updates trains while the rest of the step generates, which needs a "
                             "generator of its own: set trainer.mode: async (or trainer.stream_updates: false)")
        if self.algorithm not in STREAM_UPDATE_ALGORITHMS:
            raise ValueError(f"trainer.stream_updates does not run algorithm {self.algorithm}: a mini-batch trains "
                             "before the step is whole, so its advantages may only use its own prompt groups "
                             f"({', '.join(STREAM_UPDATE_ALGORITHMS)}); set trainer.stream_updates: false")
        chunk = self.rollout.stream_prompts * self.rollout.n
        if not chunk:
            raise ValueError("trainer.stream_updates needs rollout.stream_prompts > 0: without chunks the first "
                             "mini-batch is ready only when the whole step is")
        if self.actor.epochs != 1:
            raise ValueError(f"trainer.stream_updates trains each mini-batch once, as it arrives; actor.epochs="
                             f"{self.actor.epochs} needs the whole step: set actor.epochs: 1")
        mini = self.mini_batch_size
        if mini % chunk or mini >= self.sequences_per_step:
            raise ValueError(f"trainer.stream_updates needs actor.mini_batch_size ({mini}) to be a multiple of a "
                             f"chunk's {chunk} rows (rollout.stream_prompts x rollout.n) and below the step's "
                             f"{self.sequences_per_step}, so that a mini-batch completes before the step does")
        return self

    def role_models(self) -> dict[str, str]:
        """Each role that runs a model, with the model it loads (path, hub id or catalog name)."""
        return {role: source for role, (_, source) in self.role_model_keys().items()}

    def role_model_keys(self) -> dict[str, tuple[str, str]]:
        """Each role that runs a model: the recipe key its model comes from, and the model."""
        roles = self.algorithm_spec.roles_for(self.uses_reference)
        found = {role: self._first_set(keys) for role, keys in MODEL_KEYS.items() if role in roles}
        return {role: pair for role, pair in found.items() if pair is not None}

    def _first_set(self, keys: tuple[str, ...]) -> tuple[str, str] | None:
        for key in keys:
            section, name = key.split(".")
            value = getattr(getattr(self, section), name)
            if value:
                return key, value
        return None

    @property
    def algorithm_spec(self) -> Algorithm:
        """The algorithm's roles, trained sections and settings section (`trainer/roles.py`)."""
        return ALGORITHMS[self.algorithm]

    @property
    def critic_source(self) -> str:
        """The (reward) critic's initial weights: `critic.path`, else the reward model, else the actor."""
        return self._first_set(MODEL_KEYS["critic"])[1]

    @property
    def cost_critic_source(self) -> str:
        """Safe-RLHF's cost critic's initial weights: `cost.critic_path`, else the cost model, else
        the reward critic's."""
        return self._first_set(MODEL_KEYS["cost_critic"])[1]

    @property
    def kl(self) -> KLSettings:
        """The active algorithm's KL settings, from its own section (the one place they live)."""
        section = getattr(self, self.algorithm_spec.settings)
        return KLSettings(section.kl_coef, section.kl_estimator, section.kl_in_reward)

    @property
    def clip(self) -> tuple[float, float]:
        """The active algorithm's PPO ratio clip (clip_low, clip_high)."""
        section = getattr(self, self.algorithm_spec.settings)
        return section.clip_low, section.clip_high

    @property
    def loss_agg_mode(self) -> str:
        """The active algorithm's loss aggregation (`engine/rlmath/aggregation.py`)."""
        return getattr(self, self.algorithm_spec.settings).loss_agg_mode

    @property
    def policy_loss(self) -> str:
        """The active algorithm's policy loss (`engine/rlmath/policy_losses.py`)."""
        return getattr(self, self.algorithm_spec.settings).policy_loss

    @property
    def uses_reference(self) -> bool:
        """Whether the run starts a reference worker: a KL term, unless the actor serves it."""
        return self.kl.coef > 0 and not self.reference_in_actor

    @property
    def reference_in_actor(self) -> bool:
        """With the actor's LoRA (and no other `reference.path`) the reference is the actor's own
        base weights with its adapters switched off: no second copy of the model is loaded."""
        same = self.reference.path in (None, self.model.path)
        return self.kl.coef > 0 and self.actor.lora is not None and same

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


Recipe = create_model(
    "Recipe", __base__=RecipeSections, __module__=__name__,
    __doc__="A whole training recipe. See recipes/ for commented examples.",
    **{name: (section, Field(default_factory=section, description=ALGORITHMS[name].description))
       for name, section in SECTIONS.items()},
)
