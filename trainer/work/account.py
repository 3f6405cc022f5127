"""Each step's work account: what every phase needed, and what the workers computed.

Per phase of the step that ran (its stage was timed, or its models counted work) the step's event
gets `work/<phase>/needed_flops` and `work/<phase>/needed_bytes` (`needed.py`, from the
step's rows) and `work/<phase>/computed_flops` (the engine's meter, `engine/work_meter.py`,
summed over every group's ranks; absent where nothing was counted: the vllm engine runs outside
the meter). Where the phase's work is parts that run one after another (`needed.Part`:
generation's prefill and its decoding steps by live rows, an update's passes and AdamW), each
part's `work/<phase>/part/<name>/{flops,bytes,passes}` too. Only counters: `hflow bench step`
turns them into time limits and shares of them.

Counted as it ran: ReMax's greedy rollout and DAPO's extra sampling rounds are generation work
its rows do not need (their rollouts are not the step's batch), so they show as computed above
needed. In `trainer.mode: async` the generator works ahead: its generation is counted at the
step during which it ran, and on the ray backend (the rollout role's pool) not at all: asking it
would wait behind the generation in flight.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from hflow.engine import columns as col
from hflow.engine import work_meter
from hflow.engine.groups.dist import pick_device
from hflow.engine.groups.worker import resolve
from hflow.engine.models.loading import resolve_dtype
from hflow.errors import UserError
from hflow.mapper.models import ModelShape, resolve_model
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.step_memory import decoded_rows
from hflow.trainer.work.needed import (
    Part,
    StepRows,
    add_parts,
    computed_flops,
    forward_flops,
    generation_parts,
    lora_params,
    reward_counts,
    scoring_counts,
    step_rows,
    update_flops,
    update_parts,
    weights_bytes,
    whole,
)

PHASES = ("generate", "old_log_prob", "reference", "values", "reward", "update_actor", "update_critic")
# The models (by the label their workers count under) whose work each phase is.
PHASE_MODELS = {"generate": ("actor",), "old_log_prob": ("actor",), "reference": ("reference",),
                "values": ("critic", "cost_critic"), "reward": ("reward", "cost"), "update_actor": ("actor",),
                "update_critic": ("critic", "cost_critic")}
LM_HEAD = ("actor", "reference")  # the others score with a hidden x 1 head


def work_metrics(groups, recipe: Recipe, view, timings: dict[str, float], step: int | None = None,
                 ahead: dict | None = None) -> dict[str, float]:
    """The step's `work/*` keys; `view` holds its rows' attention and response masks and uids.
    `ahead` (the caller's, kept across steps) holds work done ahead for later steps (`step_counts`)."""
    counts = step_counts(take_counts(groups), step, {} if ahead is None else ahead)
    shapes = role_shapes(recipe)
    rows = step_rows(view[col.ATTENTION_MASK], view[col.RESPONSE_MASK].shape[1],
                     view[col.UID] if col.UID in view else None,
                     view[col.INPUT_IDS] if col.INPUT_IDS in view else None)
    metrics = {}
    for phase in PHASES:
        if phase not in timings and phase not in counts:
            continue
        labels = [label for label in needed_labels(phase, recipe) if label in shapes]
        if not labels:  # a reward function: no model to account for
            continue
        parts = add_parts([phase_needs(phase, label, shapes[label], rows, recipe) for label in labels])
        metrics[f"work/{phase}/needed_flops"], metrics[f"work/{phase}/needed_bytes"] = whole(parts)
        if set(parts) != {"pass"}:
            metrics.update(part_metrics(phase, parts))
        counted = {label: c for label, c in counts.get(phase, {}).items() if label in shapes}
        if counted:
            metrics[f"work/{phase}/computed_flops"] = sum(
                computed_flops(shapes[label], label in LM_HEAD, c) for label, c in counted.items())
    return metrics


def needed_labels(phase: str, recipe: Recipe) -> tuple[str, ...]:
    """The models a phase needs: the reference is the actor's base weights under the actor's LoRA."""
    if phase == "reference":
        return ("actor",) if recipe.reference_in_actor else ("reference",)
    return PHASE_MODELS[phase]


def step_counts(counts: dict, step: int | None, ahead: dict) -> dict:
    """The counts of step `step`: those taken now, with the work done ahead for this step (async
    mode's generator, `work_meter.for_step`) moved under its phase, whether it was taken now or
    with an earlier step (then kept in `ahead`, by step); work done ahead for a later step goes
    into `ahead` until that step. A step of None takes everything as it is."""
    out: dict = {}
    pending = list(counts.items())
    if step is not None:
        pending += ahead.pop(step, {}).items()
    for phase, labels in pending:
        base, for_step = work_meter.of_step(phase)
        if step is not None and for_step is not None and for_step > step:
            _merge(ahead.setdefault(for_step, {}).setdefault(phase, {}), labels)
        else:
            _merge(out.setdefault(base, {}), labels)
    return out


def _merge(into: dict, labels: dict) -> None:
    for label, fields in labels.items():
        target = into.setdefault(label, {})
        for field, value in fields.items():
            target[field] = target.get(field, 0) + value


def take_counts(groups) -> dict[str, dict[str, dict[str, int]]]:
    """Every group's ranks' meter counts, summed ({phase: {label: {field: count}}}). The rollout role
    of async mode is not asked (its calls queue behind the generation it runs ahead)."""
    total: dict[str, dict[str, dict[str, int]]] = {}
    for role, group in groups.items():
        if role == "rollout" or not group.has_method("take_work"):
            continue
        for rank in resolve(group.take_work()):
            for phase, labels in rank.items():
                _merge(total.setdefault(phase, {}), labels)
    return total


def role_shapes(recipe: Recipe) -> dict[str, ModelShape]:
    """The shape of each role's model (the mapper's `resolve_model`), where it is known."""
    shapes = {}
    for role, source in recipe.role_models().items():
        config = Path(source).expanduser() / "config.json"
        stamp = config.stat().st_mtime_ns if config.is_file() else None  # a model rebuilt in place is read again
        shape = _shape(source, recipe.model.init if source == recipe.model.path else None, stamp)
        if shape is not None:
            shapes[role] = shape
    return shapes


@functools.lru_cache(maxsize=32)
def _shape(source: str, init: str | None, _stamp: int | None) -> ModelShape | None:
    try:
        return resolve_model(source, init=init)
    except UserError:
        return None


def dtype_bytes(recipe: Recipe) -> int:
    """Bytes per weight in the run's dtype (`model.dtype`, `auto` as the workers resolve it)."""
    dtype = resolve_dtype(recipe.model.dtype, pick_device(recipe.trainer.device))
    return torch.finfo(dtype).bits // 8


def decode_batch_rows(recipe: Recipe) -> int:
    """Rows the hf engine decodes together: whole prompt groups within `rollout.batch_size`."""
    return decoded_rows(recipe.rollout.batch_size, recipe.rollout.n)


def trained_params(recipe: Recipe, section: str, shape: ModelShape) -> int:
    """Parameters the optimizer updates: the model's, or its LoRA adapters' (and a critic's head)."""
    lm_head = section == "actor"
    lora = getattr(recipe, section).lora
    if lora is None:
        return shape.params(lm_head)
    return lora_params(shape, lora.rank, lora.target_modules) + (0 if lm_head else shape.hidden)


def phase_needs(phase: str, label: str, shape: ModelShape, rows: StepRows, recipe: Recipe) -> dict[str, Part]:
    """The parts of the work (`needed.Part`) that `phase` needs of the model `label` for the step's
    `rows`: generation's prefill and decoding steps, an update's passes and optimizer steps, else
    one pass ("pass")."""
    lm_head, nbytes = label in LM_HEAD, dtype_bytes(recipe)
    if phase == "generate":
        return generation_parts(shape, rows, decode_batch_rows(recipe), nbytes)
    if phase == "reward":
        return {"pass": Part(forward_flops(shape, False, reward_counts(rows)), weights_bytes(shape, False, nbytes))}
    if phase.startswith("update_"):
        section = "actor" if phase == "update_actor" else "critic"
        steps = recipe.updates_per_step(section)
        return update_parts(shape, lm_head, nbytes, steps, trained_params(recipe, section, shape),
                            update_flops(shape, lm_head, rows, getattr(recipe, section).epochs, steps))
    return {"pass": Part(forward_flops(shape, lm_head, scoring_counts(rows)), weights_bytes(shape, lm_head, nbytes))}


def part_metrics(phase: str, parts: dict[str, Part]) -> dict[str, float]:
    """`work/<phase>/part/<name>/{flops,bytes,passes}`: what `bench_account` sets its limit from."""
    return {f"work/{phase}/part/{name}/{field}": float(value) for name, p in parts.items()
            for field, value in (("flops", p.flops), ("bytes", p.nbytes), ("passes", p.passes))}


def event_parts(event: dict, phase: str) -> dict[str, Part]:
    """`part_metrics` read back from a step's event; a phase logged as one pass, its totals."""
    prefix = f"work/{phase}/part/"
    names = dict.fromkeys(key[len(prefix):].rsplit("/", 1)[0] for key in event if key.startswith(prefix))
    if not names:
        return {"pass": Part(event[f"work/{phase}/needed_flops"], event.get(f"work/{phase}/needed_bytes", 0.0))}
    return {name: Part(event[f"{prefix}{name}/flops"], event[f"{prefix}{name}/bytes"],
                       int(event[f"{prefix}{name}/passes"])) for name in names}
