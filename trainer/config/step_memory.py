"""Does one training step fit? `hflow validate` and the start of `hflow train` ask
(`control/preflight.py`), before anything is allocated.

Sizes a schema accepts one by one can still be impossible together: `prompts_per_step:
1000000000` or `max_response_length: 1000000000` would pass and then grow until the machine runs
out of memory, or fail at the first generation. Two checks, each one line naming the recipe file:

- prompt + response must fit the model's context (`max_position_embeddings` of its config.json);
- the step's memory (`step_memory`, a rough lower bound) must fit the machine's: on the CPU all
  of it; with a GPU only the rows, which the controller holds in the machine's memory (what the
  GPUs hold is `placement/memory_check.py`'s). The model's weights and optimizer state are not
  counted here: they do not grow with these sizes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe

GiB = 1024**3
# Bytes per token of a step's rows: the int64 token ids, attention mask and positions, and the
# per-response-token columns (response ids and mask, the rollout's, old policy's and reference's
# log-probs, entropy, advantages, returns), about eight 8-byte columns in all.
ROW_BYTES_PER_TOKEN = 64
LOGIT_BYTES = 4 * 2  # float32 logits and, in the update, their gradient
SCORE_LOGIT_BYTES = 4  # a scoring pass's float32 logits, without a gradient


@dataclass(frozen=True)
class ModelDims:
    """What the step's memory depends on in the model's config.json."""

    layers: int
    kv_dim: int  # num_key_value_heads x head_dim: keys (and values) per token per layer
    vocab: int
    max_positions: int | None = None  # max_position_embeddings


@dataclass(frozen=True)
class StepMemory:
    """Bytes of a step: its rows, the logits of one forward/backward pass, the KV cache of one
    decoding batch."""

    rows: int
    logits: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.rows + self.logits + self.kv_cache


def step_memory(prompts: int, n: int, prompt_len: int, response_len: int, decode_rows: int, micro_rows: int,
                dims: ModelDims | None, dtype_bytes: int, score_rows: int = 0) -> StepMemory:
    """The memory of one step (bytes), a pure function of the recipe's sizes.

    rows:   prompts x n sequences of prompt_len + response_len tokens, ROW_BYTES_PER_TOKEN each;
    logits: micro_rows sequences' response tokens over the vocabulary (the LM head runs on those
            positions only: `engine/training/logprobs.py`), float32 with their gradient, or a
            scoring pass's score_rows sequences' without one, whichever is larger;
    KV:     decode_rows sequences decoded together, every layer's keys and values at prompt +
            response length, in the model's dtype (`engine/rollout/fast_decode.py` allocates it whole).
    Without `dims` (no config to read) only the rows are counted."""
    length = prompt_len + response_len
    rows = prompts * n * length * ROW_BYTES_PER_TOKEN
    if dims is None:
        return StepMemory(rows, 0, 0)
    logits = max(micro_rows * LOGIT_BYTES, score_rows * SCORE_LOGIT_BYTES) * response_len * dims.vocab
    kv_cache = decode_rows * length * 2 * dims.layers * dims.kv_dim * dtype_bytes
    return StepMemory(rows, logits, kv_cache)


def model_dims(recipe: Recipe) -> ModelDims | None:
    """The actor's dims: from its local config.json, else the mapper's catalog (a hub id, or the
    `model.init` shape of a model not built yet, without a context length); None when unknown."""
    config_file = Path(recipe.model.path) / "config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            return None  # `check_inputs` reports an unreadable model folder
        config = config.get("text_config", config)
        try:
            heads = int(config["num_attention_heads"])
            head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
            return ModelDims(int(config["num_hidden_layers"]),
                             int(config.get("num_key_value_heads") or heads) * head_dim,
                             int(config["vocab_size"]), config.get("max_position_embeddings"))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
    from hflow.mapper.models import resolve_model

    try:
        shape = resolve_model(recipe.model.path, init=recipe.model.init)
    except UserError:
        return None
    return ModelDims(shape.layers, shape.kv_dim, shape.vocab)


def recipe_step_memory(recipe: Recipe, dims: ModelDims | None) -> StepMemory:
    """`step_memory` at the recipe's sizes: the `hf` engine's larger decoding batch, the rollout's
    (rollout.batch_size sequences, whole prompt groups) or an evaluation's (`eval_decode_rows`;
    vLLM keeps its own cache), the actor's micro-batches."""
    r, length = recipe.rollout, recipe.data.max_prompt_length + recipe.rollout.max_response_length
    sequences = recipe.sequences_per_step
    decode = max(rollout_decode_rows(recipe) if r.engine == "hf" else 0, eval_decode_rows(recipe))
    actor = recipe.actor
    micro = max(1, actor.micro_batch_tokens // length) if actor.micro_batch_tokens else actor.micro_batch_size
    dtype_bytes = 2 if recipe.model.dtype == "bfloat16" else 4
    return step_memory(recipe.trainer.prompts_per_step, r.n, recipe.data.max_prompt_length, r.max_response_length,
                       decode, min(micro, sequences), dims, dtype_bytes, min(actor.scoring_micro_batch, sequences))


def decoded_rows(batch: int, n: int) -> int:
    """Rows of one decoding batch of the hf engine: whole groups of n within `batch` (at least one)."""
    return max(1, batch // n) * n


def rollout_decode_rows(recipe: Recipe) -> int:
    """Rows the hf engine decodes together in a rollout: rollout.batch_size in whole prompt groups,
    at most a step's sequences."""
    return min(recipe.sequences_per_step, decoded_rows(recipe.rollout.batch_size, recipe.rollout.n))


def eval_decode_rows(recipe: Recipe) -> int:
    """The most sequences an evaluation decodes at once on the hf engine (eval.batch_size, else
    rollout.batch_size; whole prompt groups), counted as rows of the rollout's length that hold as
    much KV cache (an evaluation's responses may be longer); 0 without evaluation or with vLLM."""
    e, r, data = recipe.eval, recipe.rollout, recipe.data
    if r.engine != "hf":
        return 0
    passes = [(e.n, e.response_limit(r.max_response_length))] if data.eval else []
    for s in e.sets:
        limit = e.response_limit(r.max_response_length, s)
        passes += [(1, limit)] + ([(s.k, limit)] if s.k > 1 else [])
    batch, prompt = e.batch_size or r.batch_size, data.max_prompt_length
    tokens = max((decoded_rows(batch, n) * (prompt + limit) for n, limit in passes), default=0)
    return -(-tokens // (prompt + r.max_response_length))


def machine_memory() -> int | None:
    """This machine's memory in bytes (/proc/meminfo's MemTotal, else psutil's); None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


def check_step(recipe: Recipe, origin: str) -> None:
    """A UserError naming `origin` when prompt + response exceed the model's context, or the step
    cannot fit this machine's memory (see the module docstring)."""
    prompt, response = recipe.data.max_prompt_length, recipe.rollout.max_response_length
    dims = model_dims(recipe)
    if dims and dims.max_positions and prompt + response > dims.max_positions:
        raise UserError(f"{origin}: data.max_prompt_length {prompt} + rollout.max_response_length {response} = "
                        f"{prompt + response} tokens, more than model {recipe.model.path!r} holds "
                        f"(max_position_embeddings {dims.max_positions}); lower them to add up to at most that")
    need, have = recipe_step_memory(recipe, dims), machine_memory()
    if have is None or need.total <= have:
        return
    on_cpu = _runs_on_cpu(recipe) if need.rows <= have else True
    counted = need.total if on_cpu else need.rows
    if counted <= have:
        return
    parts = [f"rows {need.rows / GiB:.2f} ({recipe.trainer.prompts_per_step} prompts x {recipe.rollout.n} "
             f"responses x {prompt}+{response} tokens)"]
    if on_cpu:
        parts += [f"logits {need.logits / GiB:.2f}", f"KV cache {need.kv_cache / GiB:.2f}"]
    raise UserError(f"{origin}: one step needs about {counted / GiB:.2f} GiB of this machine's memory "
                    f"({', '.join(parts)} GiB), more than its {have / GiB:.2f} GiB; lower trainer.prompts_per_step, "
                    "rollout.n, rollout.max_response_length or data.max_prompt_length"
                    + (f" (or actor.micro_batch_size, {_decode_key(recipe)})" if on_cpu else ""))


def _decode_key(recipe: Recipe) -> str:
    """The key that sizes the larger decoding batch: the rollout's, or an evaluation's."""
    return "eval.batch_size" if eval_decode_rows(recipe) > rollout_decode_rows(recipe) else "rollout.batch_size"


def _runs_on_cpu(recipe: Recipe) -> bool:
    """Whether the run computes on the CPU: trainer.device cpu, or auto without a GPU named
    (cluster.gpu) or visible."""
    if recipe.trainer.device != "auto":
        return recipe.trainer.device == "cpu"
    if recipe.cluster.gpu.lower() not in ("auto", "cpu"):
        return False
    if recipe.cluster.gpu.lower() == "cpu" or os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return True
    from hflow.mapper.devices import visible_gpus  # imports torch: only in this borderline case

    return visible_gpus() == 0
