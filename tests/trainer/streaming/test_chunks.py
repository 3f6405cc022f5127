"""The streaming data plane's controller side (`trainer/streaming/chunks.py`) with fake stages:
chunks carry their index, a stage starts on a chunk while the next one is still being generated,
and an error on the producer thread reaches the controller at its chunk."""

import threading
import time

import pytest
import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.trainer.streaming.chunks import on_thread, prompt_chunks, score_chunks


def _prompts(n: int) -> Batch:
    return Batch({"ids": torch.arange(n)}, meta={"step": 3})


def test_prompt_chunks_split_the_step_in_order_and_tag_each_chunk():
    chunks = prompt_chunks(_prompts(8), 2)
    assert [c["ids"].tolist() for c in chunks] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [c.meta for c in chunks] == [{"step": 3, "chunk": k} for k in range(4)]
    assert prompt_chunks(_prompts(8), 0)[0].meta == {"step": 3}  # unstreamed: the step's own seed stream
    assert prompt_chunks(_prompts(8), 8)[0].meta == {"step": 3}


def _slow_generate(log: list, seconds: float = 0.2):
    def generate(chunk: Batch) -> Batch:
        time.sleep(seconds)
        log.append(("generated", chunk.meta["chunk"], time.monotonic()))
        return chunk | Batch({col.GENERATED_AT: torch.full((len(chunk),), time.time(), dtype=torch.float64)})
    return generate


def test_a_stage_starts_on_the_first_chunk_while_the_later_ones_are_still_generating():
    """Shown by order, not by clocks: the last chunk's generation waits until chunk 0 has been
    scored, which only a pipeline without a barrier between the stages can satisfy (with one, the
    wait times out)."""
    log, timings = [], {}
    chunk_0_scored = threading.Event()

    def generate(chunk: Batch) -> Batch:
        if chunk.meta["chunk"] == 3:
            assert chunk_0_scored.wait(timeout=120), "chunk 0 was not scored while the later chunks generated"
        log.append(("generated", chunk.meta["chunk"]))
        return chunk | Batch({col.GENERATED_AT: torch.full((len(chunk),), time.time(), dtype=torch.float64)})

    def stage(chunk: Batch) -> Batch:
        log.append(("scored", chunk.meta["chunk"]))
        scored = chunk | Batch({col.REWARD_STARTED_AT: torch.full((len(chunk),), time.time(), dtype=torch.float64)})
        if chunk.meta["chunk"] == 0:
            chunk_0_scored.set()
        return scored

    parts = prompt_chunks(_prompts(8), 2)
    batch, metrics = score_chunks(on_thread(generate, parts, timings), [stage], pad_token_id=0)
    assert batch["ids"].tolist() == list(range(8))  # every row once, in order
    assert log.index(("scored", 0)) < log.index(("generated", 3))  # streamed: no barrier between the stages
    # The last row was generated after the first reward call began (causally, so on any clock).
    assert metrics["stream/chunks"] == 4 and metrics["stream/reward_lead_s"] > 0
    assert timings["generate"] > 0


def test_an_error_on_the_producer_thread_reaches_the_controller_after_the_chunks_before_it():
    def generate(chunk: Batch) -> Batch:
        if chunk.meta["chunk"] == 2:
            raise RuntimeError("CUDA out of memory")
        return chunk

    got = []
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        for chunk in on_thread(generate, prompt_chunks(_prompts(8), 2), {}):
            got.append(chunk.meta["chunk"])
    assert got == [0, 1]


def test_a_controller_that_stops_early_ends_the_producer_after_the_chunk_in_progress():
    log = []
    stream = on_thread(_slow_generate(log, 0.1), prompt_chunks(_prompts(8), 2), {})
    next(stream)
    stream.close()  # as when a stage raised on chunk 0
    assert not any(t.name == "hflow-stream" for t in threading.enumerate())
    assert len(log) <= 2  # chunk 0, and at most the one in progress
