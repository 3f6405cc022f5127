"""The run directory's layout: the one record of a training run, named here once.

    OUTPUT_DIR/<run-name>/
      recipe.yaml     the fully resolved recipe (every local path absolute: `config/load.absolute_paths`)
      recipe.sha256   its hash, also kept in every checkpoint: an edited recipe.yaml is refused on
                      resume (`recipe_file.py`)
      status.json     running | finished | failed, step k of N (rewritten atomically)
      events.jsonl    one JSON object per step (metrics, timings, throughput, memory)
      samples.jsonl   a few sampled generations per step
      plan.json       the placement: pools, the roles on each, their ranks; on a CPU, the product
                      kernels the run chose when it began, which a resume keeps (`product_route.settle`)
      train.log       the log
      run.lock        held (flock) by the live `hflow train` writing the run; the kernel drops it
                      when that process ends, even by kill -9. It holds that process's pid and host.
      checkpoints/step_000010/   complete checkpoints only: trainer_state.json, then COMPLETE
                                 last (see `RunDir.commit_checkpoint`)
      checkpoints/damaged/       checkpoints that no longer verify (`checkpoints.verify`), moved
                                 aside for inspection: never resumed from, never counted as kept
      final/          the trained actor as a Hugging Face model directory (written into
                      `.final.tmp`, then renamed: a `final/` is always whole)

`writer.py` writes it, one process at a time (the lock; `checkpoints.py` verifies a checkpoint
before a resume uses it), every file through `files.py`, which follows no symbolic link; `read.py`, `watcher.py` and the CLI read it, while it is being written,
without the lock. Nothing secret is written here: the recipe holds no tokens, and the
environment is never copied.
"""

from __future__ import annotations

RECIPE = "recipe.yaml"
RECIPE_HASH = "recipe.sha256"
STATUS = "status.json"
EVENTS = "events.jsonl"
SAMPLES = "samples.jsonl"
PLAN = "plan.json"
PLAN_PRODUCTS = "cpu_products"  # in plan.json: the route, as `product_route.route_text` writes it
LOG = "train.log"
LOCK = "run.lock"
CHECKPOINTS = "checkpoints"
FINAL = "final"
FINAL_STAGING = ".final.tmp"  # the export is written here, then renamed to final/
FINAL_REPLACED = ".final.old"  # a final/ from before, while the new one takes its place
DAMAGED = "damaged"  # under checkpoints/

TRAINER_STATE = "trainer_state.json"  # in a checkpoint: the step and the controller's state
COMPLETE = "COMPLETE"  # written last into a checkpoint: it is whole; lists each file's size (checkpoints.py)

RUN_FILES = (STATUS, EVENTS, RECIPE)  # any one of them marks a directory as a run
# What hflow writes at the top of a run directory: none of them may be a symbolic link (`files.py`).
WRITTEN = (RECIPE, RECIPE_HASH, STATUS, EVENTS, SAMPLES, PLAN, LOG, LOCK, CHECKPOINTS, FINAL, FINAL_STAGING,
           FINAL_REPLACED, *(name + ".tmp" for name in (RECIPE, RECIPE_HASH, STATUS, EVENTS, SAMPLES, PLAN)))


def checkpoint_name(step: int) -> str:
    """The folder of step `step`'s checkpoint under `checkpoints/`, e.g. step_000010."""
    return f"step_{step:06d}"
