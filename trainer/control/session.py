"""What every algorithm's controller needs around its loop, so the loop itself stays short.

A Session owns the run directory, the prompt data, the worker groups, the timings of
each stage, the per-step event, checkpoints and resume. An algorithm file creates one,
asks it for the steps to run, and reports each finished step to it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from typing import Any, Iterator

from hflow.engine import columns as col
from hflow.engine.kernels.product_route import settle
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dist import pick_device
from hflow.engine.groups.worker import resolve
from hflow.engine.models.loading import load_tokenizer
from hflow.errors import RunFailed, UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.evaluate import Evaluator
from hflow.trainer.control.nonfinite import SKIPPED, check_update, nonfinite_problem, scorer_name
from hflow.trainer.control.step_record import rollout_metrics, samples
from hflow.trainer.data.prompts import PromptData
from hflow.trainer.placement.cpu_share import share_for
from hflow.trainer.placement.worker_groups import WorkerGroups, build_worker_groups
from hflow.trainer.report.progress import Progress
from hflow.trainer.report.wandb_log import WandbLogger
from hflow.trainer.rundir import layout
from hflow.trainer.rundir.writer import RunDir
from hflow.trainer.stop import is_stop, stop_message
from hflow.trainer.streaming.chunks import score_chunks
from hflow.trainer.work.account import work_metrics

log = logging.getLogger("hflow.session")
# The columns a step's event and samples are computed from (fetched once per step).
STEP_COLUMNS = (col.SCORES, col.COSTS, col.RESPONSE_MASK, col.ATTENTION_MASK, col.ENTROPY, col.OLD_LOG_PROBS,
                col.REF_LOG_PROBS, col.PROMPT, col.RESPONSE_TEXT, col.EPISODE, col.UID, col.INPUT_IDS)


class Session:
    def __init__(self, recipe: Recipe, run: RunDir, roles: list[str]):
        self.recipe = recipe
        self.run = run
        self.device = pick_device(recipe.trainer.device)
        tokenizer = load_tokenizer(recipe.model.path, recipe.model.trust_remote_code)
        self.pad_token_id = tokenizer.pad_token_id  # what a streamed step's chunks are padded with
        self.data = PromptData(recipe.data, tokenizer, recipe.seed, recipe.trainer.prompts_per_step)
        self.evaluator = Evaluator(recipe, tokenizer) if recipe.trainer.eval_every else None
        address = run.ray_address or recipe.placement.ray_address  # `--ray-address` (or RAY_ADDRESS) first
        # On a CPU, the product kernels this run began with, in every process of it (a resume too).
        self.products = settle(run.read_plan().get(layout.PLAN_PRODUCTS)) if self.device.type == "cpu" else None
        try:
            self.groups: WorkerGroups = build_worker_groups(recipe, roles, self.device, address)
            products = {layout.PLAN_PRODUCTS: self.products.choice} if self.products else {}
            run.write_plan({**self.groups.plan(), **products})
            _check_divisible(recipe, self.groups)
        except BaseException:
            self._restore_products()  # no run: the process's environment as it was
            raise
        self.cpu = share_for(recipe, self.groups.backend, self.device,
                             compute_threads=2 if recipe.trainer.mode == "async" else 1)  # + generator thread
        self.cpu_metrics: dict[str, float] = {}
        self.timings: dict[str, float] = {}
        self.work_ahead: dict[int, dict] = {}  # work done ahead for later steps (`work/account.py`)
        self.start_step = 1
        self.progress = Progress(recipe.trainer.total_steps, recipe.logging.progress)
        self._step_started = 0.0
        self._wandb = None
        self._tracked: dict[str, Any] = {}
        self._resumed_state: dict[str, Any] = {}
        self._last_step = 0
        self._closed = False
        self.skipped_steps = 0  # steps without an update for a NaN/inf score (trainer.on_nonfinite: skip_step)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Whatever ends the run early (an error, Ctrl-C or SIGTERM, a lost worker) marks it failed,
        closes the progress display and the wandb run, and the worker groups always shut down. A
        worker lost with its node (ray backend) is reported as the node's loss, with its roles."""
        lost = self.groups.lost_nodes() if isinstance(exc, RunFailed) else None
        try:
            if exc is not None and not self._closed:
                self.fail(self._last_step, lost or failure_message(exc))
        finally:
            self.cpu.restore()
            self.groups.shutdown()
            self._restore_products()
        if lost:  # a worker died with its node: the node is what the user needs to hear of
            raise RunFailed(lost) from None

    def _restore_products(self) -> None:
        if self.products is not None:
            self.products.restore()
            self.products = None

    # --- set-up and resume ------------------------------------------------------------

    def init_workers(self) -> None:
        """Initialise every role; when the run has a checkpoint, continue from it (each role's
        `init_model(checkpoint)` gets its own directory of it, `<checkpoint>/<role>`, or None).
        A checkpoint whose files do not verify is skipped for the one before it, in one line."""
        checkpoint, skipped = self.run.resume_checkpoint()
        for line in skipped:
            log.warning("%s", line)
            print(line, file=sys.stderr, flush=True)
        for role, group in self.groups.items():
            group.init_model(checkpoint=str(checkpoint / role) if checkpoint else None)
        if checkpoint:
            state = json.loads((checkpoint / layout.TRAINER_STATE).read_text())
            self._resumed_state = state
            self.start_step = state["step"] + 1
            self._last_step = state["step"]
            self.run.truncate_events(state["step"])
            log.info("resumed from %s at step %d", checkpoint, self.start_step)
        elif self.run.events():
            # A resume before the first checkpoint starts over: what was logged is dropped, not repeated.
            self.run.truncate_events(-1)
            log.info("no checkpoint yet: starting over from step 1")
        self.skipped_steps = max((e.get(SKIPPED, 0) for e in self.run.events()), default=0)
        self._wandb = _open_wandb(self.recipe, self.run)

    def track(self, name: str, obj):
        """Keep `obj`'s `state_dict()` in every checkpoint (trainer_state.json) under `name`, and
        restore it now when the run resumed: controller-side state such as a KL controller or a
        Lagrange multiplier then continues exactly. Call after `init_workers`. Returns `obj`."""
        self._tracked[name] = obj
        if name in self._resumed_state:
            obj.load_state_dict(self._resumed_state[name])
        return obj

    def steps(self) -> Iterator[int]:
        total = self.recipe.trainer.total_steps
        self.progress.start(self.start_step - 1)
        self.run.write_status("running", self.start_step - 1)
        if self.evaluator and self.start_step == 1:
            self._log_baseline()
        for step in range(self.start_step, total + 1):
            self.timings = {}
            self.cpu_metrics = self.cpu.before_step()
            self._step_started = time.perf_counter()
            yield step

    def prompts(self, step: int) -> Batch:
        return self.data.batch(step)

    def old_log_probs(self, batch: Batch) -> Batch:
        """Stage `old_log_prob`: the policy's log-probs of its rollout, scored by the training
        engine; skipped (the sampler's are kept) with `actor.recompute_old_log_probs: false`."""
        if not self.recipe.actor.recompute_old_log_probs:
            if self.generator_owns_memory():  # the next stages score beside the actor
                self.groups["actor"].end_rollout()
            return batch
        with self.stage("old_log_prob"):
            return batch | self.groups["actor"].compute_log_prob(batch)

    def reference_log_probs(self, batch: Batch) -> Batch:
        """Stage `reference`: the frozen reference's log-probs, when the recipe has a KL term. With
        the actor's LoRA the actor scores them itself, its adapters switched off."""
        reference = self.groups["actor"] if self.recipe.reference_in_actor else self.groups.get("reference")
        if reference is None:
            return batch
        with self.stage("reference"):
            return batch | reference.compute_ref_log_prob(batch)

    def score_stream(self, chunks, reward) -> tuple[Batch, dict[str, float]]:
        """Stages `reference` and `reward` on each chunk of a step's rollout as it arrives
        (`streaming/chunks.py`); the joined step and its `stream/*` metrics. The reference runs on the
        joined step instead when it is the actor itself (LoRA: its adapters switched off), whose
        weights the generation in flight is using."""
        if self.generator_owns_memory():
            chunks = list(chunks)  # the whole step generated first (see `generator_owns_memory`)
            self.groups["actor"].end_rollout()
        batch, metrics = score_chunks(chunks, self.chunk_stages(reward), self.pad_token_id)
        if self.recipe.reference_in_actor:
            batch = self.reference_log_probs(batch)
        return batch, metrics

    def generator_owns_memory(self) -> bool:
        """Whether the actor generates with weights of its own (vLLM, ZeRO-3's gathered copy) on devices
        a scoring model shares: scoring then waits for the whole generation and for the generator's
        memory (`ActorWorker.end_rollout`): beside a woken generator hybrid engines run out of it."""
        r, a = self.recipe.rollout, self.recipe.actor
        owns = self.recipe.trainer.mode != "async" and (r.engine == "vllm" or a.zero_stage == 3)
        return owns and bool(self.groups.colocated_with("actor"))

    def chunk_stages(self, reward) -> list:
        """The stages a chunk goes through as soon as it is generated: the reference (unless the
        actor serves it, see `score_stream`) and the reward."""
        def score(chunk):
            with self.stage("reward"):
                return chunk | reward.compute_reward(chunk)

        return [score] if self.recipe.reference_in_actor else [self.reference_log_probs, score]

    def finite_scores(self, batch: Batch, step: int, *more_scores) -> bool:
        """True when every reward and cost of the step (the batch's, and ReMax's greedy baseline
        in `more_scores`) is finite. Otherwise `trainer.on_nonfinite` decides: `error` stops the run
        with one line naming the scorer, the step and the rows; `skip_step` counts the step as skipped
        and returns False: the loop then logs it with `end_step` and makes no update."""
        view = batch.select(col.SCORES, col.COSTS)
        checks = [("reward", "score", view[col.SCORES])] + [("reward", "greedy score", m) for m in more_scores]
        if col.COSTS in view:
            checks.append(("cost", "cost", view[col.COSTS]))
        for section, what, values in checks:
            problem = nonfinite_problem(values.float(), what, step)
            if problem is None:
                continue
            line = f"{scorer_name(self.recipe, section)} {problem}"
            if self.recipe.trainer.on_nonfinite == "error":
                raise UserError(f"{line}; set trainer.on_nonfinite: skip_step to skip such steps")
            self.skipped_steps += 1
            log.warning("%s; the step is skipped (trainer.on_nonfinite: skip_step)", line)
            return False
        return True

    @contextlib.contextmanager
    def stage(self, name: str):
        """Time a stage. Colocated roles run in order anyway, so the stage waits for its work;
        with several pools, stages overlap and this is the time until the controller moved on."""
        start = time.perf_counter()
        self.groups.set_stage(name)
        try:
            yield
            if len(self.groups.pools) == 1:
                self.groups.settle()
        finally:
            self.groups.set_stage(None)
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    # --- end of a step ----------------------------------------------------------------

    def end_step(self, step: int, batch: Batch, *metrics: dict[str, float]) -> dict[str, Any]:
        """Log the step's event: rollout statistics, then each metrics dict (actor, critics, ...)."""
        metrics = [resolve(part) for part in metrics]
        for part in metrics:
            check_update(step, part)  # before the step is logged or saved
        view = batch.select(*STEP_COLUMNS)
        elapsed = self.step_elapsed()
        event = {"step": step, "time": time.time(), **rollout_metrics(view, self.recipe)}
        for part in metrics:
            event.update(part)
        if self.skipped_steps:
            event[SKIPPED] = self.skipped_steps
        if len(self.groups.pools) > 1:
            # Stages on different pools overlap: report the time the workers spent in each.
            self.timings.update(self.groups.worker_stage_seconds())
        event.update({f"timing/{k}": v for k, v in self.timings.items()})
        # work/<phase>/*: needed and computed; async mode's generator works ahead for later steps
        event.update(work_metrics(self.groups, self.recipe, view, self.timings, step, self.work_ahead))
        event.update(self.cpu_metrics)
        event["timing/step"] = elapsed
        event["throughput/tokens_per_s"] = float(view[col.ATTENTION_MASK].sum()) / elapsed
        if self._eval_due(step):
            event.update(self.evaluate(step))  # after timing/step: a step's time stays comparable
        self.run.append_event(event)
        self.run.append_samples(samples(view, step, self.recipe.logging.samples_per_step))
        if self._wandb:
            self._wandb.log(event)
        total = self.recipe.trainer.total_steps
        every = self.recipe.trainer.save_every
        if step == total or (every and step % every == 0):
            self.save_checkpoint(step)
        self.run.write_status("running", step)
        self._last_step = step
        self.progress.update(step, event)
        log.info("step %d %s", step, json.dumps(event))
        return event

    def step_elapsed(self) -> float:
        """Seconds since the current step started."""
        return time.perf_counter() - self._step_started

    def evaluate(self, step: int) -> dict[str, float]:
        """eval/* of the current policy (see `trainer/control/evaluate.py`), with its time as timing/eval."""
        start = time.perf_counter()
        metrics = self.evaluator.run(self.groups["actor"], self.groups["reward"], step)
        return {**metrics, "timing/eval": time.perf_counter() - start}

    def _eval_due(self, step: int) -> bool:
        every = self.recipe.trainer.eval_every
        return bool(self.evaluator) and (step % every == 0 or step == self.recipe.trainer.total_steps)

    def _log_baseline(self) -> None:
        """The step-0 event: eval/* of the initial policy, before any update (no training metrics)."""
        event = {"step": 0, "time": time.time(), **self.evaluate(0)}
        self.run.append_event(event)
        if self._wandb:
            self._wandb.log(event)
        self.progress.update(0, event)
        log.info("step 0 %s", json.dumps(event))

    def save_checkpoint(self, step: int) -> None:
        with self.stage("checkpoint"), self.run.writing_checkpoint(step):
            tmp = self.run.staging_checkpoint(step)
            for role, group in self.groups.items():
                if group.has_method("save_checkpoint"):
                    group.save_checkpoint(str(tmp / role))
            state = {"step": step, **{name: obj.state_dict() for name, obj in self._tracked.items()}}
            self.run.commit_checkpoint(tmp, step, state)

    def finish(self) -> None:
        with self.stage("export"), self.run.writing_final() as final:  # final/ appears whole or not at all
            self.groups["actor"].export_weights(str(final))
        self.run.write_status("finished", self.recipe.trainer.total_steps)
        self._closed = True
        self.progress.close(self.run.events())
        if self._wandb:
            self._wandb.finish("finished")

    def fail(self, step: int, error: str) -> None:
        """Mark the run failed at `step` (the last one completed) with a one-line `error`."""
        self._closed = True
        self.run.write_status("failed", step, error)
        self.progress.close(None)
        if self._wandb:
            self._wandb.finish("failed")


def failure_message(err: BaseException) -> str:
    """The one line status.json keeps for an error: a user's or a worker's as it is written,
    Ctrl-C as `interrupted`, SIGTERM as `terminated (SIGTERM)` (`stop.py`), anything else with
    its type."""
    if is_stop(err):
        return stop_message(err)
    if isinstance(err, (UserError, RunFailed)):  # a worker's error is a RunFailed
        return str(err)
    return f"{type(err).__name__}: {err}"


def _check_divisible(recipe: Recipe, groups: WorkerGroups) -> None:
    """Batches split evenly over each group's data-parallel ranks, and the actor's ranks split into
    whole generation (tensor-parallel) groups, or the run does not start."""
    for role, group in groups.items():
        world = group.world_size
        tp = recipe.rollout.tensor_parallel_size
        if role == "actor" and world % tp:
            raise UserError(f"rollout.tensor_parallel_size={tp} does not divide the {world} ranks of the actor "
                            f"group; use a divisor of {world} or give the actor a multiple of {tp} devices")
        sizes = [("trainer.prompts_per_step", recipe.trainer.prompts_per_step),
                 ("actor.mini_batch_size", recipe.mini_batch_size),
                 *([("rollout.stream_prompts", recipe.rollout.stream_prompts)] if recipe.rollout.stream_prompts else [])]
        if role in ("critic", "cost_critic"):
            sizes.append(("critic.mini_batch_size", recipe.critic.mini_batch_size or recipe.sequences_per_step))
        for key, value in sizes:
            if value % world:
                raise UserError(f"{key}={value} does not split evenly over the {world} ranks of the "
                                f"{role} group; use a multiple of {world}")


def _open_wandb(recipe: Recipe, run: RunDir):
    wandb = recipe.logging.wandb
    return WandbLogger(wandb.model_dump(), run.path, recipe.model_dump(mode="json")) if wandb.enabled else None
