"""Per-step controller overhead on the local and ray backends, and the Ray start-up time.

    python benchmarks/controller_overhead.py [--steps 20]

Runs the GRPO quickstart recipe for a few steps on (a) the local backend, (b) the ray
backend with every role colocated on one CPU slot, (c) ray split over two slots, all in
one process one after another (same machine, same moment), and prints the median step
time, the time spent inside worker methods (local: measured around each call; ray: measured
inside the worker processes) and their difference: the controller's own cost per step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from hflow.cli.quiet import quiet_libraries
from hflow.engine.models.loading import build_tiny_model
from hflow.trainer.algorithms import grpo
from hflow.trainer.config.load import load_recipe
from hflow.trainer.control import session as session_module
from hflow.trainer.rundir.writer import RunDir


def run(label: str, overrides: list[str], steps: int, model: str, out: str) -> dict:
    recipe, _ = load_recipe("grpo/quickstart", [f"model.path={model}", "model.init=null",
                                                f"trainer.total_steps={steps}", "trainer.save_every=0",
                                                "logging.progress=lines", *overrides])
    recipe.name = label
    inside: list[float] = []
    started = {}
    original_end_step = session_module.Session.end_step
    original_init = session_module.Session.init_workers

    def init_workers(self):
        started["groups"] = time.perf_counter() - started["t0"]
        original_init(self)
        started["ready"] = time.perf_counter() - started["t0"]
        self._busy0 = self.groups.busy_s()

    def end_step(self, step, batch, *metrics):
        worker = self.groups.worker_stage_seconds() if self.groups.cluster else {}
        event = original_end_step(self, step, batch, *metrics)
        if self.groups.cluster:
            inside.append(sum(worker.values()) if worker else float("nan"))
        else:
            busy = self.groups.busy_s()
            inside.append(busy - self._busy0)
            self._busy0 = busy
        return event

    session_module.Session.end_step, session_module.Session.init_workers = end_step, init_workers
    try:
        started["t0"] = time.perf_counter()
        run_dir = RunDir.create(recipe, out)
        grpo.train(recipe, run_dir)
        run_dir.close()
    finally:
        session_module.Session.end_step, session_module.Session.init_workers = original_end_step, original_init
    events = run_dir.events()[2:]  # the first steps warm up
    step_s = statistics.median(e["timing/step"] for e in events)
    inside_s = statistics.median(inside[2:])
    return {"label": label, "step_s": step_s, "inside_s": inside_s, "groups_s": started["groups"],
            "ready_s": started["ready"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    quiet_libraries()
    torch.set_num_threads(1)  # the ray workers get one core each; compare like with like
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny_model(f"{tmp}/tiny"))
        rows = [
            run("local", [], args.steps, model, tmp),
            run("ray-colocated", ["placement.backend=ray", "cluster.cpu_slots=1"], args.steps, model, tmp),
            run("ray-split", ["placement.backend=ray", "placement.mode=split", "cluster.cpu_slots=2"],
                args.steps, model, tmp),
        ]
    print(f"{'backend':<15}{'step s':>9}{'in workers s':>14}{'controller s':>14}{'start-up s':>12}")
    for r in rows:
        overhead = r["step_s"] - r["inside_s"]
        print(f"{r['label']:<15}{r['step_s']:>9.3f}{r['inside_s']:>14.3f}{overhead:>14.3f}{r['ready_s']:>12.1f}")
    print("in workers: ray-split counts the busiest worker per stage (stages overlap), so its "
          "controller column is step minus the critical path's worker time.")


if __name__ == "__main__":
    main()
