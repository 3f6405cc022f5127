"""Run directories in the format `hflow train` writes (see trainer/rundir/layout.py), built without
training: the fixtures `run_factory` and `event_line` (registered in tests/conftest.py)."""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path

import pytest

STAGES = ("generate", "reference", "values", "reward", "advantage", "update_critic", "update_actor")


def event(step: int, algorithm: str = "ppo", t0: float = 1_700_000_000.0) -> dict:
    """A deterministic events.jsonl line: reward/mean = 0.1 * step, timings = stage index + 1 over 10."""
    ev = {
        "step": step,
        "time": t0 + 2.0 * step,
        "reward/mean": 0.1 * step,
        "reward/std": 0.05,
        "reward/min": 0.1 * step - 0.2,
        "reward/max": 0.1 * step + 0.2,
        "kl/mean": 0.01 * step,
        "entropy/mean": 2.0 - 0.01 * step,
        "response_length/mean": 100.0 + step,
        "actor/loss": -0.5 + 0.01 * step,
        "actor/grad_norm": 1.5,
        "actor/lr": 1e-6,
        "throughput/tokens_per_s": 1000.0 + 10 * step,
        "memory/peak_bytes": 2**30 + step,
        "memory/actor/rank0/peak_bytes": 3 * 2**30,
        "memory/actor/rank1/peak_bytes": 2**31,
    }
    for i, stage in enumerate(STAGES):
        if algorithm != "ppo" and stage in ("values", "update_critic"):
            continue
        ev[f"timing/{stage}"] = (i + 1) / 10
    ev["timing/step"] = sum(v for k, v in ev.items() if k.startswith("timing/")) + 0.05
    if algorithm == "ppo":
        ev["critic/loss"] = 1.0 / step
        ev["critic/vf_explained_var"] = 0.5
    if algorithm == "safe_rlhf":
        ev["cost/mean"] = math.sin(step)
        ev["lagrange/lambda"] = 0.01 * step
    return ev


def write_events(run_dir: Path, steps, algorithm: str = "ppo") -> None:
    with open(run_dir / "events.jsonl", "a") as f:
        for s in steps:
            f.write(json.dumps(event(s, algorithm)) + "\n")


def make_run(
    root: Path,
    name: str = "ppo-tiny",
    algorithm: str = "ppo",
    steps: int = 5,
    total_steps: int = 10,
    status: str = "running",
    pid: int | None = None,
    started: float = 1_700_000_000.0,
    hostname: str | None = None,
    plan: bool = True,
    samples: bool = True,
) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(
        f"name: {name}\nalgorithm: {algorithm}\nmodel:\n  path: tiny-llama\ntrainer:\n  total_steps: {total_steps}\n"
    )
    (run / "status.json").write_text(json.dumps({
        "name": name, "algorithm": algorithm, "model": "tiny-llama", "status": status,
        "step": steps, "total_steps": total_steps, "started": started, "updated": started + 2.0 * steps,
        "pid": pid if pid is not None else os.getpid(), "hostname": hostname or socket.gethostname(),
        "error": "RuntimeError: CUDA out of memory" if status == "failed" else None,
    }))
    (run / "events.jsonl").write_text("")
    write_events(run, range(1, steps + 1), algorithm)
    (run / "train.log").write_text("".join(f"INFO step {s} done\n" for s in range(1, steps + 1)))
    if plan:
        (run / "plan.json").write_text(json.dumps({
            "backend": "local",
            "pools": [{"name": "pool0", "devices": ["cuda:0", "cuda:1"], "roles": ["actor", "reference"]},
                      {"name": "pool1", "devices": ["cuda:2"], "roles": ["critic", "reward"]}],
            "roles": {"actor": {"pool": "pool0", "ranks": [0, 1]}, "reference": {"pool": "pool0", "ranks": [0, 1]},
                      "critic": {"pool": "pool1", "ranks": [0]}, "reward": {"pool": "pool1", "ranks": [0]}},
        }))
    if samples:
        with open(run / "samples.jsonl", "w") as f:
            for s in range(1, steps + 1):
                for j in range(2):
                    f.write(json.dumps({"step": s, "prompt": f"prompt {s}.{j}", "response": f"answer {s}.{j}",
                                        "reward": s + j / 10}) + "\n")
    return run


@pytest.fixture
def run_factory(tmp_path):
    """make_run bound to tmp_path/runs."""
    def factory(**kw):
        return make_run(tmp_path / "runs", **kw)
    return factory


@pytest.fixture
def event_line():
    """event() as one events.jsonl line (with its newline)."""
    def line(step: int, algorithm: str = "ppo") -> str:
        return json.dumps(event(step, algorithm)) + "\n"
    return line
