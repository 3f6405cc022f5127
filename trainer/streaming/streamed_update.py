"""Streamed updates (`trainer.stream_updates`): the actor trains each mini-batch as soon as its
rows are generated and scored, while the rest of the step is still generating (AsyncFlow's
streamed training: the trainer takes a mini-batch when it is complete).

In async mode the rollout comes from a generator with its own copy of the weights
(`async_rollout.py`), so the training weights are free while a step generates. Without this the
update waits for the whole step. With it the step's chunks (`rollout.stream_prompts`) are taken
in mini-batches of whole chunks (`streaming.grouped`), and each mini-batch, once scored, goes
through:

  old log-probs  scored by the training weights just before its own update, i.e. after the
                 previous mini-batch's (with `actor.recompute_old_log_probs`; otherwise the
                 sampler's, as in the unstreamed step). That policy is the mini-batch's proximal
                 policy in AReaL's decoupled objective (Fu et al. 2025): PPO's clip keeps its update
                 near it, and `actor.off_policy_correction` weighs the gap to the sampler.
  advantages     from its own prompt groups (so GRPO, GSPO and RLOO; REINFORCE++ normalises
                 over the whole step).
  update         one optimizer step, as the unstreamed step's k-th mini-batch.

With `actor.recompute_old_log_probs: false` a streamed step is the unstreamed one exactly on one
rank (tested): the same mini-batches in the same order, the same old log-probs and dropout
seeds. On several ranks a streamed mini-batch is consecutive rows of the step, where an
unstreamed one is every rank's k-th slice of its share.

The policy version still counts steps: the generator is refreshed after the step's last update,
so the staleness bound and the resume point (a step boundary) do not change. A non-finite score
with `trainer.on_nonfinite: skip_step` skips the updates from its mini-batch on; the mini-batches
trained before it stay trained.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from hflow.engine import columns as col
from hflow.engine.groups.worker import resolve
from hflow.trainer.streaming.chunks import grouped, join, scored, stream_metrics


def train_streamed(session, chunks: Iterable, reward, compute: Callable, step: int):
    """Score and train step `step`'s chunks mini-batch by mini-batch; the step's rows (for its
    event), the actor's metrics over the mini-batches, and the `stream/*` metrics."""
    recipe = session.recipe
    actor = session.groups["actor"]
    chunk_rows = recipe.rollout.stream_prompts * recipe.rollout.n
    minis = grouped(scored(chunks, session.chunk_stages(reward)), recipe.mini_batch_size // chunk_rows,
                    session.pad_token_id)
    logged, updates, first_trained_at, trainable = [], [], None, True
    for k, mini in enumerate(minis):
        if recipe.reference_in_actor:  # LoRA: the actor's base weights, which no update changes
            mini = session.reference_log_probs(mini)
        mini = session.old_log_probs(mini)  # the weights now: after mini-batch k - 1's update
        logged.append(mini)
        trainable = trainable and session.finite_scores(mini, step)
        if not trainable:
            continue
        with session.stage("advantage"):
            mini |= compute(mini, recipe)
        with session.stage("update_actor"):
            updates.append(resolve(actor.update_actor(mini, first_mini_batch=k)))
        if first_trained_at is None:
            first_trained_at = time.time()
    batch = join(logged, session.pad_token_id)
    metrics = {**stream_metrics(batch, recipe.sequences_per_step // chunk_rows),
               "stream/mini_batches": float(len(logged))}
    if first_trained_at is not None:
        # > 0: the first mini-batch was trained before the step's last row was generated.
        metrics["stream/update_lead_s"] = float(batch.select(col.GENERATED_AT)[col.GENERATED_AT].max()
                                                - first_trained_at)
    return batch, combined(updates), metrics


def combined(updates: list[dict[str, float]]) -> dict[str, float]:
    """The actor's metrics of a step trained in several calls, as one call over all its
    mini-batches reports them (`ActorWorker.update_actor`): each metric's mean over the
    mini-batches, the trained tokens summed, the peak memory's maximum, the last learning rate."""
    keys = list(dict.fromkeys(k for u in updates for k in u))
    out = {}
    for key in keys:
        values = [u[key] for u in updates if key in u]
        if key == "tokens/trained":
            out[key] = float(sum(values))
        elif key == "memory/peak_bytes":
            out[key] = max(values)
        elif key == "actor/lr":
            out[key] = values[-1]
        else:
            out[key] = sum(values) / len(values)
    return out

