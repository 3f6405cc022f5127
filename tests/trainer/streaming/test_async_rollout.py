"""The async producer (`trainer/streaming/async_rollout.py`) with a fake actor: how far it runs
ahead, the staleness each step trains at, and what a generator failure does."""

import contextlib
import threading
from types import SimpleNamespace

import pytest
import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.errors import RunFailed
from hflow.trainer.streaming.async_rollout import AsyncRollout, LocalGenerator, RolloutGroup, staleness_metrics
from hflow.trainer.placement.cpu_share import CpuShare
from hflow.trainer.streaming.chunks import join


def take(producer: AsyncRollout, step: int):
    """Step `step`'s whole rollout: its chunks, as the producer hands them out, joined."""
    return join(list(producer.chunks(step)), producer.session.pad_token_id)


class FakeActor:
    """Generates one row per step, stamped with the version it was last refreshed to."""

    def __init__(self, fail_at: int | None = None, hang_at: int | None = None):
        self.version = None
        self.hang_at = hang_at
        self.cancelled = threading.Event()
        self.lock = threading.Lock()
        self.generated: dict[int, int] = {}  # step -> the version that generated it
        self.fail_at = fail_at

    def refresh_generator(self, version: int) -> dict:
        with self.lock:
            self.version = version
        return {}

    def cancel_generation(self) -> None:
        self.cancelled.set()

    def generate_async(self, prompts: Batch) -> Batch:
        step = prompts.meta["step"]
        if step == self.fail_at:
            raise RuntimeError("CUDA out of memory")
        if step == self.hang_at:  # a long generation, until cancelled
            assert self.cancelled.wait(timeout=30)
            raise RuntimeError("cancelled")
        with self.lock:
            self.generated[step] = self.version
            return Batch({col.POLICY_VERSION: torch.tensor([self.version, self.version])}, meta={"step": step})


class FakeSession:
    def __init__(self, actor, total: int, backend: str = "local", start_step: int = 1, max_staleness: int = 1,
                 rollout=None, worker_timeout_s: float | None = None, stream_prompts: int = 0):
        self.groups = _Groups(backend, actor, rollout)
        self.recipe = SimpleNamespace(trainer=SimpleNamespace(total_steps=total, mode="async",
                                                              max_staleness=max_staleness,
                                                              worker_timeout_s=worker_timeout_s),
                                      rollout=SimpleNamespace(stream_prompts=stream_prompts))
        self.pad_token_id = 0
        self.start_step = start_step
        self.timings: dict[str, float] = {}
        self.cpu = CpuShare(params=None, on=False)

    def prompts(self, step: int) -> Batch:
        return Batch(meta={"step": step})

    def step_elapsed(self) -> float:
        return 1.0

    @contextlib.contextmanager
    def stage(self, name: str):
        yield


class _Groups(dict):
    def __init__(self, backend, actor, rollout=None):
        super().__init__(actor=actor, **({"rollout": rollout} if rollout is not None else {}))
        self.backend = backend


def _producer(actor, total: int, max_staleness: int = 1, **session) -> AsyncRollout:
    fake = FakeSession(actor, total, max_staleness=max_staleness, **session)
    return AsyncRollout(fake, max_staleness, LocalGenerator(fake))


def _wait_ready(producer: AsyncRollout, steps: range) -> None:
    with producer.cond:
        assert producer.cond.wait_for(lambda: all(s in producer.complete for s in steps), timeout=30)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_producer_runs_ahead_to_the_bound_and_each_step_trains_within_it(k):
    total = 6
    actor = FakeActor()
    producer = _producer(actor, total, k)
    producer.start()
    seen = []
    for step in range(1, total + 1):
        _wait_ready(producer, range(step, min(step + k, total) + 1))  # everything the bound allows now
        with producer.cond:
            assert max(producer.ready) <= step + k  # and nothing past it
        take(producer, step)
        seen.append(producer.metrics()["async/staleness_max"])
        producer.trained(step)
    producer.stop(cancel=False)
    # Step s was generated at version max(0, s - 1 - k) and trains at s - 1: staleness min(k, s - 1).
    assert seen == [min(k, s - 1) for s in range(1, total + 1)]
    assert actor.generated == {s: max(0, s - 1 - k) for s in range(1, total + 1)}


def test_a_resumed_producer_starts_at_the_first_untrained_step_from_the_checkpoint_version():
    actor = FakeActor()
    producer = _producer(actor, 5, start_step=4)
    producer.start()
    _wait_ready(producer, range(4, 6))
    producer.stop(cancel=False)
    assert actor.generated == {4: 3, 5: 3}  # nothing before step 4 is generated again


def test_a_generator_failure_ends_the_step_with_one_line_naming_it():
    actor = FakeActor(fail_at=2)
    producer = _producer(actor, 4)
    producer.start()
    take(producer, 1)
    producer.trained(1)
    with pytest.raises(RunFailed) as err:
        take(producer, 2)
    assert str(err.value) == "the async rollout generator failed at step 2: RuntimeError: CUDA out of memory"
    producer.stop(cancel=False)


def test_a_run_that_ends_early_cancels_the_generation_in_progress_and_joins_the_producer():
    actor = FakeActor(hang_at=2)
    producer = _producer(actor, 4)
    producer.start()
    take(producer, 1)
    producer.stop(cancel=True)  # as when step 1's update fails: step 2 is being generated
    assert actor.cancelled.is_set() and not producer.thread.is_alive()
    assert producer.error is None  # the cancelled generation is not the run's error


def test_a_row_past_the_bound_stops_the_run():
    batch = Batch({col.POLICY_VERSION: torch.tensor([3, 1])})
    assert staleness_metrics(batch, 3, 2) == {"async/staleness_mean": 1.0, "async/staleness_max": 2.0,
                                              "async/policy_version": 3.0}
    with pytest.raises(RunFailed, match="generated by policy version 1 would train at version 4, beyond "
                                        "trainer.max_staleness=2"):
        staleness_metrics(batch, 4, 2)


class StaleActor(FakeActor):
    """Stamps its rows with a version two behind the one it holds: a scheduling bug."""

    def generate_async(self, prompts: Batch) -> Batch:
        batch = super().generate_async(prompts)
        return Batch({col.POLICY_VERSION: batch[col.POLICY_VERSION] - 2}, meta=batch.meta)


def test_a_chunk_past_the_bound_stops_the_run_before_it_is_handed_over():
    producer = _producer(StaleActor(), 3, max_staleness=1)
    producer.start()
    chunks = producer.chunks(1)
    with pytest.raises(RunFailed, match="generated by policy version -2 would train at version 0"):
        next(chunks)  # streamed updates train a chunk as it comes: it must not come
    producer.stop(cancel=False)


class FakeFuture:
    """A ray backend result: computed once `done` is set; reading a column of a failed one raises."""

    __hflow_future__ = True

    def __init__(self, batch: Batch, done: threading.Event, error: Exception | None = None):
        self.batch, self.done, self.error = batch, done, error

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(timeout_s)

    def select(self, *keys):
        if self.error:
            raise self.error
        return self.batch.select(*keys)

    def __getitem__(self, key):
        return self.select(key)[key]


class FakeRolloutPool:
    """The rollout role (`RolloutGroup`'s view of it): its weights arrive bucket by bucket, and each
    generation is stamped with the version of the last complete refresh."""

    def __init__(self, never_done_at: int | None = None):
        self.version = None
        self.loads: list[tuple[str, int | None]] = []
        self.generated: dict[int, int] = {}
        self.never_done_at = never_done_at

    def load_weights(self, bucket, version):
        self.loads.append((bucket, version))
        if version is not None:
            self.version = version

    def generate(self, prompts: Batch) -> FakeFuture:
        step = prompts.meta["step"]
        self.generated[step] = self.version
        done = threading.Event()
        if step != self.never_done_at:
            done.set()
        return FakeFuture(Batch({col.POLICY_VERSION: torch.tensor([self.version] * 2)}), done)


class FakeTrainPool:
    def __init__(self):
        self.sent = 0

    def open_weight_stream(self) -> int:
        return 3

    def next_weight_bucket(self) -> str:
        self.sent += 1
        return f"bucket{self.sent}"


def _ray_producer(pool: FakeRolloutPool, total: int, max_staleness: int = 1, **session) -> AsyncRollout:
    fake = FakeSession(FakeTrainPool(), total, max_staleness=max_staleness, rollout=pool, **session)
    return AsyncRollout(fake, max_staleness, RolloutGroup(fake))


def test_a_refresh_of_the_rollout_pool_sends_every_bucket_and_the_version_with_the_last():
    pool = FakeRolloutPool()
    producer = _ray_producer(pool, 3)
    producer.start()  # the first refresh: version 0
    _wait_ready(producer, range(1, 3))
    assert pool.loads == [("bucket1", None), ("bucket2", None), ("bucket3", 0)]
    take(producer, 1)
    producer.trained(1)
    assert pool.loads[3:] == [("bucket4", None), ("bucket5", None), ("bucket6", 1)]
    _wait_ready(producer, range(3, 4))
    take(producer, 2)
    producer.trained(2)
    take(producer, 3)
    producer.stop(cancel=False)
    assert pool.generated == {1: 0, 2: 0, 3: 1}  # one step ahead: step 3 waited for version 1


def test_the_rollout_pool_s_producer_stops_at_once_while_a_generation_never_ends():
    producer = _ray_producer(FakeRolloutPool(never_done_at=2), 4)
    producer.start()
    take(producer, 1)
    producer.stop(cancel=True)
    assert not producer.thread.is_alive() and producer.error is None


def test_a_rollout_pool_that_never_answers_ends_the_run_at_the_watchdog():
    producer = _ray_producer(FakeRolloutPool(never_done_at=1), 2, worker_timeout_s=0.5)
    producer.start()
    with pytest.raises(RunFailed, match=r"rollout worker failed: no answer to generate within 0.5 s "
                                        r"\(trainer.worker_timeout_s\)"):
        take(producer, 1)
    producer.stop(cancel=True)


def test_a_generator_failure_in_a_real_run_marks_it_failed_at_its_last_trained_step(tiny_model, tmp_path,
                                                                                     monkeypatch):
    import json

    from hflow.engine.groups.dispatch import Dispatch, register
    from hflow.engine.workers.actor import ActorWorker
    from hflow.trainer.algorithms import grpo
    from hflow.trainer.config.load import build_recipe
    from hflow.trainer.rundir.writer import RunDir

    real = ActorWorker.generate_async

    def fails_at_step_2(self, prompts):
        if prompts.meta["step"] == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(self, prompts)

    monkeypatch.setattr(ActorWorker, "generate_async", register(Dispatch.DP_COMPUTE)(fails_at_step_2))
    recipe = build_recipe({
        "name": "async-failing", "algorithm": "grpo", "model": {"path": str(tiny_model)},
        "data": {"train": "synthetic:digits", "synthetic_size": 64},
        "rollout": {"n": 2, "max_response_length": 4},
        "actor": {"micro_batch_size": 4},
        "trainer": {"total_steps": 3, "prompts_per_step": 2, "save_every": 0, "mode": "async", "max_staleness": 1},
        "logging": {"progress": "lines"},
    }, {}, "test")
    run = RunDir.create(recipe, str(tmp_path / "runs"))
    try:
        with pytest.raises(RunFailed):
            grpo.train(recipe, run)
    finally:
        run.close()
    status = json.loads((run.path / "status.json").read_text())
    assert status["status"] == "failed" and status["step"] == 1
    assert status["error"] == ("the async rollout generator failed at step 2: RuntimeError: CUDA error: an illegal "
                               "memory access was encountered")
