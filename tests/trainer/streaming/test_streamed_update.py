"""Streamed updates' controller side (`trainer/streaming/streamed_update.py`) with a fake actor:
mini-batches of whole chunks train as they complete, each scored by the weights its predecessor
left; a non-finite score stops the step's updates from its mini-batch on; the step's metrics
combine the calls as one call reports them."""

import contextlib
import math
import time
from types import SimpleNamespace

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.trainer.streaming.streamed_update import combined, train_streamed
from hflow.trainer.streaming.chunks import grouped


def _chunk(k: int, rows: int = 2, score: float = 1.0) -> Batch:
    return Batch({"ids": torch.arange(k * rows, (k + 1) * rows), col.SCORES: torch.full((rows,), score),
                  col.GENERATED_AT: torch.full((rows,), time.time(), dtype=torch.float64)}, meta={"chunk": k})


def test_groups_of_whole_chunks_are_handed_out_as_soon_as_their_last_chunk_arrives():
    arrived = []

    def chunks():
        for k in range(5):
            arrived.append(k)
            yield _chunk(k)

    groups = []
    for group in grouped(chunks(), 2, pad_token_id=0):
        groups.append((group["ids"].tolist(), list(arrived)))
    assert groups == [([0, 1, 2, 3], [0, 1]), ([4, 5, 6, 7], [0, 1, 2, 3]), ([8, 9], [0, 1, 2, 3, 4])]


class FakeActor:
    """Each update moves the weights one version on; records what every call saw."""

    def __init__(self):
        self.version = 0
        self.scored_at: list[int] = []  # the version each mini-batch's old log-probs came from
        self.updates: list[tuple[list[int], int]] = []  # (rows, first_mini_batch)

    def compute_log_prob(self, batch: Batch) -> Batch:
        self.scored_at.append(self.version)
        return Batch({col.OLD_LOG_PROBS: torch.full((len(batch),), float(self.version))})

    def update_actor(self, batch: Batch, first_mini_batch: int = 0) -> dict[str, float]:
        assert (batch[col.OLD_LOG_PROBS] == self.version).all()  # scored by the weights it now trains
        self.updates.append((batch["ids"].tolist(), first_mini_batch))
        self.version += 1
        return {"actor/loss": float(first_mini_batch), "tokens/trained": 10.0, "actor/lr": 0.1 * self.version}


class FakeSession:
    def __init__(self, actor: FakeActor, chunks: int, chunk_rows: int, mini: int):
        self.groups = {"actor": actor}
        self.recipe = SimpleNamespace(rollout=SimpleNamespace(stream_prompts=1, n=chunk_rows), mini_batch_size=mini,
                                      sequences_per_step=chunks * chunk_rows, reference_in_actor=False)
        self.pad_token_id = 0
        self.skipped = 0
        self.stages: list[str] = []

    def chunk_stages(self, reward):
        return [lambda chunk: chunk | Batch({"rewarded": torch.ones(len(chunk))})]

    def old_log_probs(self, batch: Batch) -> Batch:
        return batch | self.groups["actor"].compute_log_prob(batch)

    def finite_scores(self, batch: Batch, step: int) -> bool:
        if torch.isfinite(batch[col.SCORES]).all():
            return True
        self.skipped += 1
        return False

    @contextlib.contextmanager
    def stage(self, name: str):
        self.stages.append(name)
        yield


def _advantages(batch: Batch, recipe) -> Batch:
    assert "rewarded" in batch  # scored before its advantages
    return Batch({col.ADVANTAGES: batch[col.SCORES] - batch[col.SCORES].mean()})


def test_each_mini_batch_trains_once_complete_scored_by_the_weights_the_previous_update_left():
    actor = FakeActor()
    session = FakeSession(actor, chunks=6, chunk_rows=2, mini=4)
    batch, metrics, streamed = train_streamed(session, (_chunk(k) for k in range(6)), None, _advantages, step=1)
    assert actor.updates == [([0, 1, 2, 3], 0), ([4, 5, 6, 7], 1), ([8, 9, 10, 11], 2)]
    assert actor.scored_at == [0, 1, 2]
    assert batch["ids"].tolist() == list(range(12)) and col.ADVANTAGES not in batch  # the step's rows, as logged
    assert metrics == {"actor/loss": 1.0, "tokens/trained": 30.0, "actor/lr": 0.1 * 3}
    assert streamed["stream/chunks"] == 6 and streamed["stream/mini_batches"] == 3
    assert "stream/update_lead_s" in streamed
    assert session.stages == ["advantage", "update_actor"] * 3


def test_a_non_finite_score_stops_the_updates_from_its_mini_batch_on():
    actor = FakeActor()
    session = FakeSession(actor, chunks=6, chunk_rows=2, mini=4)
    chunks = [_chunk(k, score=math.nan if k == 3 else 1.0) for k in range(6)]
    batch, metrics, streamed = train_streamed(session, iter(chunks), None, _advantages, step=1)
    assert actor.updates == [([0, 1, 2, 3], 0)]  # mini-batch 1 holds the NaN: it and 2 are not trained
    assert session.skipped == 1  # the step counts once
    assert len(batch) == 12 and streamed["stream/mini_batches"] == 3
    assert metrics == {"actor/loss": 0.0, "tokens/trained": 10.0, "actor/lr": 0.1}


def test_a_step_whose_first_mini_batch_is_not_finite_has_no_update_metrics():
    actor = FakeActor()
    session = FakeSession(actor, chunks=2, chunk_rows=2, mini=2)
    chunks = [_chunk(0, score=math.inf), _chunk(1)]
    _, metrics, streamed = train_streamed(session, iter(chunks), None, _advantages, step=1)
    assert actor.updates == [] and metrics == {} and "stream/update_lead_s" not in streamed


def test_the_first_update_is_done_before_a_slow_step_is_generated():
    actor = FakeActor()
    session = FakeSession(actor, chunks=4, chunk_rows=2, mini=2)
    done_before: list[bool] = []

    def chunks():
        for k in range(4):
            if k == 3:
                done_before.append(bool(actor.updates))
                time.sleep(0.2)
            yield _chunk(k)

    _, _, streamed = train_streamed(session, chunks(), None, _advantages, step=1)
    assert done_before == [True] and streamed["stream/update_lead_s"] > 0.15


def test_combined_metrics_by_hand():
    updates = [{"actor/loss": 1.0, "actor/grad_norm": 2.0, "tokens/trained": 7.0, "memory/peak_bytes": 5.0,
                "actor/lr": 0.1},
               {"actor/loss": 3.0, "actor/grad_norm": 4.0, "tokens/trained": 9.0, "memory/peak_bytes": 3.0,
                "actor/lr": 0.2, "actor/kl_loss": 0.5}]
    assert combined(updates) == {"actor/loss": 2.0, "actor/grad_norm": 3.0, "tokens/trained": 16.0,
                                 "memory/peak_bytes": 5.0, "actor/lr": 0.2, "actor/kl_loss": 0.5}
    assert combined([]) == {}
