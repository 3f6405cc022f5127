"""The run directory's layout: the one record of a training run, named here once.

    OUTPUT_DIR/<run-name>/
      recipe.yaml     the fully resolved recipe
      status.json     running | finished | failed, step k of N (rewritten atomically)
      events.jsonl    one JSON object per step (metrics, timings, throughput, memory)
      samples.jsonl   a few sampled generations per step
      plan.json       the placement: pools, the roles on each, their ranks
      train.log       the log
      run.lock        held (flock) by the live `hflow train` writing the run; the kernel drops it
                      when that process ends, even by kill -9. It holds that process's pid and host.
      checkpoints/step_000010/   complete checkpoints only: trainer_state.json, then COMPLETE
                                 last (see `RunDir.commit_checkpoint`)
      final/          the trained actor as a Hugging Face model directory

`writer.py` writes it, one process at a time (the lock; `checkpoints.py` verifies a checkpoint
before a resume uses it); `read.py`, `watcher.py` and the CLI read it, while it is being written,
without the lock. Nothing secret is written here: the recipe holds no tokens, and the
environment is never copied.
"""

from __future__ import annotations

RECIPE = "recipe.yaml"
STATUS = "status.json"
EVENTS = "events.jsonl"
SAMPLES = "samples.jsonl"
PLAN = "plan.json"
LOG = "train.log"
LOCK = "run.lock"
CHECKPOINTS = "checkpoints"
FINAL = "final"

TRAINER_STATE = "trainer_state.json"  # in a checkpoint: the step and the controller's state
COMPLETE = "COMPLETE"  # written last into a checkpoint: it is whole; lists each file's size (checkpoints.py)

RUN_FILES = (STATUS, EVENTS, RECIPE)  # any one of them marks a directory as a run


def checkpoint_name(step: int) -> str:
    """The folder of step `step`'s checkpoint under `checkpoints/`, e.g. step_000010."""
    return f"step_{step:06d}"
