"""The streaming data plane of a step: rows move between stages chunk by chunk.

Without it a step runs as barriers: generate every response, then score them all, then
train. With `rollout.stream_prompts: k` (AsyncFlow's streamed transfer, Sheng et al. 2025's
sibling paper; verl's and OpenRLHF's per-sample reward calls) the step's prompts go out in
chunks of k (whole prompt groups, so GRPO's groups stay together), each one generation call.
The reference and reward stages take a chunk as soon as it is generated, while the next
chunk generates; the actor's own stages (old log-probs, the update) take the joined step,
since they run on the weights generation is using, unless the step is generated elsewhere
(async mode) with `trainer.stream_updates`: then each mini-batch of whole chunks trains as soon
as it is scored (`streamed_update.py`).

Where the overlap comes from depends on the backend:

- ray: every call returns a future at once, so the controller sends the whole step's calls
  without waiting; a scoring worker on another pool starts on chunk k once its rows are in
  the object store, while the actor generates chunk k+1. The rows never reach the controller:
  it holds references (`ray_futures.ChunkedFuture` joins the chunks where they live).
- local: generation runs on a producer thread, the reference and reward stages on the
  controller's thread; torch releases the GIL inside its ops, so both progress on the cores.

In `trainer.mode: async` the rollout producer delivers a step's chunks the same way
(`async_rollout.py`). Every row records its prompt group (`uid`), the policy version that
generated it, when its chunk was generated (`generated_at`) and when its reward stage began
(`reward_started_at`); each step's event carries `stream/chunks` and `stream/reward_lead_s`,
how long before the last row was generated the first reward call started (> 0: they overlapped).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterable, Iterator

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.ray_futures import ChunkedFuture, Future
from hflow.engine.groups.rows import join_rows


def prompt_chunks(prompts: Batch, per_chunk: int) -> list[Batch]:
    """The step's prompts in chunks of `per_chunk` (0: one chunk), each tagged with its index:
    chunk k > 0 samples from its own seed stream (`rollout_batch.sampling_for`)."""
    if not per_chunk or per_chunk >= len(prompts):
        return [prompts]
    chunks = prompts.split(per_chunk)
    for k, chunk in enumerate(chunks):
        chunk.meta["chunk"] = k
    return chunks


def on_thread(generate: Callable[[Batch], Batch], chunks: list[Batch], timings: dict[str, float]) -> Iterator[Batch]:
    """`generate(chunk)` for each chunk on a producer thread, its results yielded in order as they
    come; the thread's busy time is added to `timings["generate"]`. An error on the thread is
    raised here; if the consumer stops early, the thread stops after the chunk in progress."""
    if len(chunks) == 1:  # nothing to overlap
        started = time.perf_counter()
        out = generate(chunks[0])
        timings["generate"] = timings.get("generate", 0.0) + time.perf_counter() - started
        yield out
        return
    results: queue.Queue = queue.Queue()
    stop = threading.Event()

    def produce() -> None:
        try:
            for chunk in chunks:
                if stop.is_set():
                    return
                started = time.perf_counter()
                out = generate(chunk)
                timings["generate"] = timings.get("generate", 0.0) + time.perf_counter() - started
                results.put((True, out))
        except BaseException as err:  # handed to the consumer, which raises it
            results.put((False, err))

    thread = threading.Thread(target=produce, name="hflow-stream", daemon=True)
    thread.start()
    try:
        for _ in chunks:
            ok, value = results.get()
            if not ok:
                raise value
            yield value
    finally:
        stop.set()
        thread.join()


def join(chunks: list, pad_token_id: int):
    """The step's chunks as one batch: a Batch (local), or a future whose rows stay in the
    object store (ray)."""
    if len(chunks) == 1:
        return chunks[0]
    if isinstance(chunks[0], Future):
        return ChunkedFuture(chunks, pad_token_id)
    return join_rows(chunks, pad_token_id)


def scored(chunks: Iterable, stages: list[Callable]) -> Iterator:
    """Each chunk through `stages` (functions of a chunk returning it with their columns) as soon
    as it arrives, yielded in order."""
    for chunk in chunks:
        for stage in stages:
            chunk = stage(chunk)
        yield chunk


def score_chunks(chunks: Iterable, stages: list[Callable], pad_token_id: int):
    """Every chunk through `stages`; the joined step and its `stream/*` metrics."""
    done = list(scored(chunks, stages))
    batch = join(done, pad_token_id)
    return batch, stream_metrics(batch, len(done))


def grouped(chunks: Iterable, per_group: int, pad_token_id: int) -> Iterator:
    """Consecutive chunks `per_group` at a time, each group joined and yielded as soon as its last
    chunk arrives (a mini-batch of whole chunks, `streamed_update.py`); a short last group too."""
    group = []
    for chunk in chunks:
        group.append(chunk)
        if len(group) == per_group:
            yield join(group, pad_token_id)
            group = []
    if group:
        yield join(group, pad_token_id)


def stream_metrics(batch, chunks: int) -> dict[str, float]:
    """stream/chunks, and stream/reward_lead_s: the last row's generation time less the first
    reward call's start (positive when scoring started before generation ended). None for a
    step of one chunk (no streaming: its event is as before)."""
    if chunks == 1:
        return {}
    metrics = {"stream/chunks": float(chunks)}
    view = batch.select(col.GENERATED_AT, col.REWARD_STARTED_AT)
    if col.GENERATED_AT in view and col.REWARD_STARTED_AT in view:
        metrics["stream/reward_lead_s"] = float(view[col.GENERATED_AT].max() - view[col.REWARD_STARTED_AT].min())
    return metrics
