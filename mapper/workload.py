"""What one RL iteration asks of each model, read from a recipe.

The mapper's unit of work is one iteration: generate the rollouts, prepare them (reference,
critic, reward and cost forward passes), train (actor and critic updates). Stages run one
after another; within a stage, models on different devices run at the same time (Section 6 of
the HybridFlow paper).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hflow.errors import UserError
from hflow.mapper.models import ModelShape, resolve_model

ROLES = ("actor", "reference", "critic", "reward", "cost")
STAGES = ("generation", "preparation", "training")
TRAINED = ("actor", "critic")


@dataclass(frozen=True)
class Workload:
    """One iteration's work. Lengths are in tokens, batches in sequences."""

    algorithm: str
    models: dict[str, ModelShape]  # role -> shape, in ROLES order
    prompts: int  # prompts per iteration
    n: int  # responses per prompt
    prompt_len: int
    response_len: int
    epochs: int = 1  # passes over each iteration's rollouts
    mini_batch: int = 0  # sequences per optimizer step; 0: all of them (one update per epoch)
    micro_batch: int = 8  # sequences per forward/backward pass
    dtype_bytes: int = 2
    min_zero_stage: int = 1
    checkpointing: bool = True
    greedy_baseline: bool = False  # ReMax: one extra greedy response per prompt
    names: dict[str, str] = field(default_factory=dict)  # role -> model as the recipe names it

    @property
    def sequences(self) -> int:
        return self.prompts * self.n

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def generated(self) -> int:
        """Sequences decoded per iteration (ReMax adds a greedy one per prompt)."""
        return self.sequences + (self.prompts if self.greedy_baseline else 0)

    @property
    def optimizer_steps(self) -> int:
        mini = self.mini_batch or self.sequences
        return self.epochs * -(-self.sequences // mini)

    @property
    def roles(self) -> list[str]:
        return list(self.models)

    def tokens(self) -> int:
        """Prompt and response tokens of one iteration: the paper's throughput numerator (Section 8.1)."""
        return self.sequences * self.seq_len


def workload_from_recipe(recipe, device_dtype_bytes: int = 2, names: dict | None = None,
                         roles: tuple[str, ...] = ROLES, known_only: bool = False) -> Workload:
    """The Workload of a validated `hflow.trainer.config.recipe.Recipe`.

    `device_dtype_bytes` resolves `model.dtype: auto` (bf16 on GPUs, fp32 on CPU, as the trainer does).
    `roles`: the roles to take from the recipe (the search plans ROLES; Safe-RLHF's `cost_critic`
    may be asked for too). `known_only`: leave out a role whose model's shape is unknown (neither
    in the catalog nor a local directory with config.json) instead of raising UserError.
    """
    role_models = recipe.role_models()
    init = recipe.model.init
    models = {}
    for role in roles:
        if role in role_models:
            spec = role_models[role]
            # `model.init` builds the actor's directory; roles defaulting to it share that shape.
            role_init = init if spec == recipe.model.path else None
            try:
                models[role] = resolve_model(spec, role=role, init=role_init)
            except UserError:
                if not known_only:
                    raise
    dtype = {"bfloat16": 2, "float32": 4}.get(recipe.model.dtype, device_dtype_bytes)
    return Workload(
        algorithm=recipe.algorithm,
        models=models,
        prompts=recipe.trainer.prompts_per_step,
        n=recipe.rollout.n,
        prompt_len=recipe.data.max_prompt_length,
        response_len=recipe.rollout.max_response_length,
        epochs=recipe.actor.epochs,
        mini_batch=recipe.mini_batch_size,
        micro_batch=recipe.actor.micro_batch_size,
        dtype_bytes=dtype,
        min_zero_stage=recipe.actor.zero_stage,
        checkpointing=recipe.model.gradient_checkpointing,
        greedy_baseline=recipe.algorithm == "remax",
        names=dict(role_models),
    )
