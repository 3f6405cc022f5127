"""Where a step's rollout comes from: generated on demand (`trainer.mode: sync`), or produced
ahead of training by a generator thread within a staleness bound (`trainer.mode: async`).

Asynchronous rollout (one-step-off-policy in verl, `async_enable` in OpenRLHF, TRL's
AsyncGRPO `max_staleness`, AReaL's staleness-bounded rollout): a producer thread generates the
rollouts of steps t+1, t+2, ... on the actor's generator copy (`engine/rollout/generator_copy.py`)
while the controller scores and trains step t; torch releases the GIL inside its ops, so the
two overlap on the local backend. Policy versions count the steps trained: the rollout of
step s may start once the generator copy holds version >= s - 1 - max_staleness, and step s
trains at version s - 1, so the staleness s - 1 - v of every row is at most max_staleness.
The copy is refreshed after every step's update (or skipped update).

The checkpoint never depends on rollouts in flight: the producer starts at the first step not
yet trained, from the checkpoint's weights, and each step's prompts and sampling seeds are fixed
by its number, so after a resume every prompt is trained once, as in the uninterrupted run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.errors import RunFailed, UserError


class SyncRollout:
    """Each step's rollout generated when the step asks for it, by the hybrid engine."""

    def __init__(self, session):
        self.session = session

    def take(self, step: int) -> Batch:
        with self.session.stage("generate"):
            return self.session.groups["actor"].generate_sequences(self.session.prompts(step))

    def trained(self, step: int) -> None:
        """Step `step` is trained (or skipped): nothing to refresh, the rollout uses the training weights."""

    def metrics(self) -> dict[str, float]:
        return {}


class AsyncRollout:
    """The producer thread and the rollouts it has ready, by step (see the module docstring)."""

    def __init__(self, session, max_staleness: int):
        self.session = session
        self.actor = session.groups["actor"]
        self.max_staleness = max_staleness
        self.version = session.start_step - 1  # the policy version the generator copy holds
        self.ready: dict[int, Batch] = {}
        self.error: BaseException | None = None
        self.stopping = False
        self.cond = threading.Condition()
        self.busy_s = self.idle_s = 0.0  # the producer's, since the last step's event
        self._step_metrics: dict[str, float] = {}
        self.thread = threading.Thread(target=self._produce, name="hflow-rollout", daemon=True)

    def start(self) -> None:
        with self.session.stage("refresh_generator"):
            self.actor.refresh_generator(self.version)
        self.thread.start()

    def _produce(self) -> None:
        step = self.session.start_step
        try:
            for step in range(self.session.start_step, self.session.recipe.trainer.total_steps + 1):
                waited = time.perf_counter()
                with self.cond:
                    self.cond.wait_for(lambda: self.stopping or self.version >= step - 1 - self.max_staleness)
                    if self.stopping:
                        return
                started = time.perf_counter()
                batch = self.actor.generate_async(self.session.prompts(step))
                with self.cond:
                    self.ready[step] = batch
                    self.idle_s += started - waited
                    self.busy_s += time.perf_counter() - started
                    self.cond.notify_all()
        except BaseException as err:  # handed to the controller, which ends the run with it
            if self.stopping:
                return  # cancelled: the run is ending for its own reason
            if not isinstance(err, (UserError, RunFailed)):
                failed = RunFailed(f"the async rollout generator failed at step {step}: {type(err).__name__}: {err}")
                failed.__cause__ = err
                err = failed
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def take(self, step: int) -> Batch:
        """Step `step`'s rollout, once generated; every row's staleness checked against the bound."""
        with self.session.stage("wait_rollout"), self.cond:
            self.cond.wait_for(lambda: step in self.ready or self.error is not None)
            if step not in self.ready:
                raise self.error
            depth = len(self.ready)
            batch = self.ready.pop(step)
        self._step_metrics = {**staleness_metrics(batch, step - 1, self.max_staleness),
                              "async/queue_depth": float(depth)}
        return batch

    def trained(self, step: int) -> None:
        """Step `step` is trained (or skipped): the generator copy gets the new weights (after the
        rollout it is generating, if any), and the producer may run further ahead."""
        with self.session.stage("refresh_generator"):
            self.actor.refresh_generator(step)
        with self.cond:
            self.version = step
            self.cond.notify_all()

    def metrics(self) -> dict[str, float]:
        """The step's async/* metrics: staleness, queue depth, and the bubble on each side."""
        timings = self.session.timings
        with self.cond:
            busy, idle, self.busy_s, self.idle_s = self.busy_s, self.idle_s, 0.0, 0.0
        train_idle = timings.get("wait_rollout", 0.0) + timings.get("refresh_generator", 0.0)
        return {**self._step_metrics, "async/generate_busy_s": busy, "async/generate_idle_s": idle,
                "async/train_busy_s": max(0.0, self.session.step_elapsed() - train_idle),
                "async/train_idle_s": train_idle}

    def stop(self, cancel: bool) -> None:
        """End the producer: with `cancel` (the run failed or was stopped), its generation in
        progress stops at the next token. The thread is always joined: torch must not be mid-op in
        it when the process exits."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if cancel:
            self.actor.cancel_generation()
        self.thread.join()


def staleness_metrics(batch: Batch, trained_version: int, max_staleness: int) -> dict[str, float]:
    """async/staleness_* of a rollout trained at `trained_version`: per row, the versions between
    the policy that generated it and the one it trains. A row past `max_staleness` is a bug in
    the scheduling, and stops the run rather than train on it."""
    staleness = trained_version - batch[col.POLICY_VERSION]
    worst, least = int(staleness.max()), int(staleness.min())
    if worst > max_staleness or least < 0:
        raise RunFailed(f"async rollout: a row generated by policy version {trained_version - worst} would "
                        f"train at version {trained_version}, beyond trainer.max_staleness={max_staleness}")
    return {"async/staleness_mean": float(staleness.float().mean()), "async/staleness_max": float(worst),
            "async/policy_version": float(trained_version)}


@contextlib.contextmanager
def rollouts(session) -> Iterator[SyncRollout | AsyncRollout]:
    """The run's rollout source for `trainer.mode`; an async producer stops with the block."""
    trainer = session.recipe.trainer
    if trainer.mode == "sync":
        yield SyncRollout(session)
        return
    if session.groups.backend != "local":
        raise UserError(f"trainer.mode async runs on the local backend only, but this placement uses "
                        f"{session.groups.backend}; set placement.backend: local or trainer.mode: sync")
    producer = AsyncRollout(session, trainer.max_staleness)
    producer.start()
    finished = False
    try:
        yield producer
        finished = True
    finally:
        producer.stop(cancel=not finished)  # on an error the run ends now, not after the rollout in flight
