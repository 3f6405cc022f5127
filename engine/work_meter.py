"""What the models of this process actually computed, counted per phase of the RL step.

Two forward hooks per model count the work that ran, padding and repeated prompts included:
the input embedding's hook counts the rows x positions entering the decoder body (every forward
embeds its input ids, the lean decoding step of `rollout/fast_decode.py` too, which calls
`embed_tokens` itself), with the causal attention they cost; the head's hook (the LM head,
`get_output_embeddings()`, or a score model's scalar head) counts the positions it ran on. A
forward run with gradients enabled also counts its backward, which costs twice the forward
(Kaplan et al. 2020, arXiv 2001.08361, Section 2.1); with activation checkpointing the forward is
computed a second time in the backward (Chen et al. 2016, arXiv 1604.06174), and counted so.

Counts are kept per (phase, model label), as integers, in this process:
  tokens           rows x positions through the body (its input embedding's input)
  keys             (query, key) pairs of causal attention: a position p with c cached positions
                   before the forward attends to c + p + 1 keys (padding counted: it is computed)
  logits           positions the head ran on
  backward_*       the same three, through a backward pass
The controller turns them into FLOPs with the model's shape (`trainer/work/needed.py`).

The phase is the worker method running, set by `groups/dispatch.register` (`PHASES`), per
thread: a streamed step generates on one thread while it scores on another. A hook adds a few
integers under a lock; nothing synchronises with the device (only shapes are read).
"""

from __future__ import annotations

import contextlib
import threading

import torch

FIELDS = ("tokens", "keys", "logits", "backward_tokens", "backward_keys", "backward_logits")
OTHER, EVAL = "other", "eval"  # work outside the step's phases; evaluation's generation and scoring
# Worker methods -> the phase of the step they compute (the controller's stage names).
PHASES = {
    "generate_sequences": "generate", "generate_async": "generate", "generate": "generate",
    "compute_log_prob": "old_log_prob", "compute_ref_log_prob": "reference",
    "compute_values": "values", "compute_reward": "reward", "compute_cost": "reward",
    "update_actor": "update_actor", "update_critic": "update_critic",
}
METER_ATTR = "_hflow_work_meter"  # on a metered model's input embedding: its ModelMeter
# Worker methods that run ahead of the step whose work they are (async mode's generator): their
# work is counted under `for_step(phase, step)`, so that the step that uses it reports it.
AHEAD = {"generate_async"}


def for_step(phase: str, step: int) -> str:
    """The phase of work done ahead for step `step` (`AHEAD`); `of_step` reads it back."""
    return f"{phase}@{step}"


def of_step(phase: str) -> tuple[str, int | None]:
    """(phase, step) of a phase written by `for_step`; (phase, None) for any other."""
    base, sep, step = phase.partition("@")
    return (base, int(step)) if sep else (phase, None)

_lock = threading.Lock()
_counts: dict[tuple[str, str], list[int]] = {}
_local = threading.local()


def current_phase() -> str:
    return getattr(_local, "phase", None) or OTHER


@contextlib.contextmanager
def working_on(phase: str):
    """Count this thread's work under `phase` until the block ends (then the phase before it)."""
    before = getattr(_local, "phase", None)
    _local.phase = phase
    try:
        yield
    finally:
        _local.phase = before


def take() -> dict[str, dict[str, dict[str, int]]]:
    """{phase: {label: {field: count}}} since the last call, and start again from zero."""
    global _counts
    with _lock:
        counts, _counts = _counts, {}
    out: dict[str, dict[str, dict[str, int]]] = {}
    for (phase, label), values in counts.items():
        out.setdefault(phase, {})[label] = dict(zip(FIELDS, values))
    return out


def _add(label: str, offset: int, tokens: int, keys: int, logits: int) -> None:
    key = (current_phase(), label)
    with _lock:
        values = _counts.get(key)
        if values is None:
            values = _counts[key] = [0] * len(FIELDS)
        values[offset] += tokens
        values[offset + 1] += keys
        values[offset + 2] += logits


def causal_keys(rows: int, positions: int, cached: int) -> int:
    """(query, key) pairs of `rows` x `positions` new positions after `cached` ones:
    rows x sum over p < positions of (cached + p + 1)."""
    return rows * (positions * cached + positions * (positions + 1) // 2)


class ModelMeter:
    """The hooks of one model. `cached` is the KV cache length the next forward starts from: set
    by the body's pre-hook from its `past_key_values`, or by a decoder that calls the embedding
    itself (`fast_decode.FastDecoder`), and used once. `keys_next`, where set, is the next
    forward's attention keys, used once: a packed forward (`training/packed.py`) runs its rows as
    one sequence, but attends within each row."""

    def __init__(self, label: str, body):
        self.label, self.body, self.cached, self.keys_next = label, body, 0, None

    def on_body(self, module, args, kwargs) -> None:
        past = kwargs.get("past_key_values")
        self.cached = int(past.get_seq_length()) if past is not None and hasattr(past, "get_seq_length") else 0

    def on_embed(self, module, args, output) -> None:
        ids = args[0]
        positions = ids.shape[-1] if ids.dim() else 1
        rows = ids.numel() // max(1, positions)
        keys = causal_keys(rows, positions, self.cached) if self.keys_next is None else self.keys_next
        self.cached, self.keys_next = 0, None
        tokens = rows * positions
        if not torch.is_grad_enabled():
            _add(self.label, 0, tokens, keys, 0)
            return
        recomputed = 2 if getattr(self.body, "gradient_checkpointing", False) else 1
        _add(self.label, 0, recomputed * tokens, recomputed * keys, 0)
        _add(self.label, 3, tokens, keys, 0)

    def on_head(self, module, args, output) -> None:
        hidden = args[0]
        positions = hidden.numel() // max(1, hidden.shape[-1])
        _add(self.label, 0, 0, 0, positions)
        if torch.is_grad_enabled():
            _add(self.label, 3, 0, 0, positions)


def _parts(model):
    """(input embedding, head, body) of a causal LM, a peft-wrapped one, or a score model
    (`models/score_model.ScoreModel`: a backbone and a scalar `head`); (None, None, None) for a
    model without the transformers accessors."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(inner, "backbone", None)
    try:
        if backbone is not None:
            return backbone.get_input_embeddings(), getattr(inner, "head", None), backbone
        body = inner.get_decoder() if hasattr(inner, "get_decoder") else None
        return inner.get_input_embeddings(), inner.get_output_embeddings(), body
    except (AttributeError, NotImplementedError):
        return None, None, None


def attach(model, label: str) -> ModelMeter | None:
    """Count `model`'s work under `label` (its role: actor, critic, ...); a model already metered
    keeps its meter, and one without an input embedding to hook is not metered (None)."""
    embed, head, body = _parts(model)
    if embed is None:
        return None
    meter = getattr(embed, METER_ATTR, None)
    if meter is not None:
        return meter
    meter = ModelMeter(label, body)
    setattr(embed, METER_ATTR, meter)
    embed.register_forward_hook(meter.on_embed)
    if head is not None:
        head.register_forward_hook(meter.on_head)
    if body is not None:
        body.register_forward_pre_hook(meter.on_body, with_kwargs=True)
    return meter


def meter_of(embedding) -> ModelMeter | None:
    """The meter on a model's input embedding module, if it is metered."""
    return getattr(embedding, METER_ATTR, None)
