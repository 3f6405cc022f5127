"""Helpers shared by the tests (importable as `helpers`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import zygote


def run_hflow(*args: str, cwd: Path | None = None, env: dict | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """The real `hflow` command in a process of its own (exit codes, stdout, stderr as a user sees
    them): `hflow train` and `hflow eval` forked from a process that has imported torch already
    (`zygote.py`), every other command, or one with start-up settings of its own, a fresh one."""
    full_env = {**os.environ, **(env or {})}
    if zygote.BASE is not None:
        server = zygote.shared()
        if server.takes(args, full_env):
            return server.run(args, cwd, full_env, timeout)
    return fresh_hflow(args, cwd, full_env, timeout)


def fresh_hflow(args: tuple[str, ...], cwd: Path | None, env: dict,
                timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m hflow ARGS` in a fresh interpreter with exactly the environment `env`."""
    return subprocess.run([sys.executable, "-m", "hflow", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)



def write_recipe(path: Path, model: Path, **sections) -> Path:
    """A small GRPO recipe file for tests; `sections` override whole sections."""
    import yaml

    recipe = {
        "name": "test",
        "algorithm": "grpo",
        "model": {"path": str(model)},
        "data": {"train": "synthetic:digits", "synthetic_size": 256},
        "rollout": {"n": 4, "max_response_length": 8},
        "actor": {"lr": 0.002, "micro_batch_size": 16, "mini_batch_size": 16},
        "trainer": {"total_steps": 4, "prompts_per_step": 8, "save_every": 2, "output_dir": str(path.parent / "runs")},
        "logging": {"progress": "lines"},
    }
    for key, value in sections.items():
        recipe[key] = {**recipe.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(recipe))
    return path


def assert_same_adam_step(got: dict, want: dict, lr: float, close: float = 1e-4) -> None:
    """Weights after one Adam step from gradients that are equal up to summation order.

    Adam's first step is ~lr * grad / (|grad| + eps) per element, so an element whose gradient
    is near eps (a token the policy almost never emits) can move by up to lr with fp32
    reduction-order noise. Every element must stay within lr; all but 0.1% within `close`.
    """
    for name in want:
        diff = (got[name] - want[name]).abs()
        assert float(diff.max()) <= lr, f"{name}: {float(diff.max())} > lr {lr}"
        assert int((diff > close).sum()) <= max(1, diff.numel() // 1000), f"{name}: many elements differ"


# Event keys that differ between two runs of the same rows: wall-clock times, throughput, memory,
# the thread count chosen from the machine's load (`cpu/*`), and the work account (`work/*`: what
# was computed depends on how rows were batched, streamed or split over ranks).
RUN_VARYING = ("time", "timing/", "throughput/", "memory/", "cpu/", "work/")

BAD_INPUTS = {"tried": 0, "clean": 0}  # counted over the session; conftest prints them


def assert_one_line_error(result, *needles: str) -> None:
    """A user mistake's answer: exit code 2, one `error: ...` line on stderr holding every
    needle, no traceback."""
    BAD_INPUTS["tried"] += 1
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    BAD_INPUTS["clean"] += 1


def assert_recipe_error(recipe: str, overrides: list[str], needles: list[str]) -> None:
    """Loading `recipe` with `overrides` (the path `hflow train` and `hflow validate` take; the
    CLI prints the line and exits 2) fails with one line naming the recipe file and every needle."""
    from hflow.errors import UserError
    from hflow.trainer.config.load import load_recipe

    try:
        load_recipe(recipe, overrides)
    except UserError as err:
        line = str(err)
    else:
        raise AssertionError(f"{recipe} with {overrides} loaded without an error")
    assert "\n" not in line and recipe + ".yaml" in line, line
    for needle in needles:
        assert needle in line, line


def finished_run(result, cwd: Path) -> tuple[Path, list[dict]]:
    """A `hflow train` that ran to its end from `cwd`: its run directory and events, one dict per step."""
    assert result.returncode == 0, result.stderr[-3000:]
    run = Path(result.stdout.strip().splitlines()[-1])
    run = run if run.is_absolute() else cwd / run
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    return run, read_events(run)


def train_run(recipe: Path) -> tuple[Path, list[dict]]:
    """`hflow train RECIPE` to its end, with no traceback on stderr: the run directory and its
    events, one dict per step."""
    full = run_hflow("train", str(recipe))
    assert full.returncode == 0, full.stderr[-3000:]
    assert "Traceback" not in full.stderr, full.stderr[-3000:]  # a run that succeeded says nothing went wrong
    run = Path(full.stdout.strip().splitlines()[-1])
    return run, read_events(run)


def read_events(run: Path) -> list[dict]:
    """A run directory's events.jsonl, one dict per step."""
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def crashed(run: Path, step: int) -> None:
    """What a crash after `step` leaves of a finished run's record: status.json still `running` at
    that step, and no final/ (the export comes after the last step)."""
    status = json.loads((run / "status.json").read_text())
    status.update(status="running", step=step)
    status.pop("error", None)
    (run / "status.json").write_text(json.dumps(status))
    shutil.rmtree(run / "final", ignore_errors=True)


def resume_after_crash(run: Path, crashed_after: int = 5, last: int = 6) -> list[dict]:
    """Make a finished run of `last` steps look as if it crashed after step `crashed_after`: step
    `last`'s checkpoint never happened, so the one before it is the last complete checkpoint, and
    the steps after that were logged up to the crash. Resume it with `hflow train --resume` and return the
    events afterwards."""
    shutil.rmtree(run / "checkpoints" / f"step_{last:06d}")
    lines = (run / "events.jsonl").read_text().splitlines()[:crashed_after]
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    crashed(run, crashed_after)
    resumed = run_hflow("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return read_events(run)


def assert_same_events(want: list[dict], got: list[dict], not_compared: tuple[str, ...],
                       required: tuple[str, ...]) -> None:
    """Two runs' events equal step by step in every key but those starting with `not_compared`;
    each of `required` must be among the keys compared (an empty comparison cannot pass)."""
    assert len(got) == len(want)
    for a, b in zip(want, got):
        compared = [k for k in a if not k.startswith(not_compared)]
        assert all(k in compared for k in required), (required, compared)
        differ = {k: (a[k], b.get(k, "missing")) for k in compared if b.get(k, "missing") != a[k]}
        assert not differ, (a["step"], differ)  # (want, got) of every key that differs


def expired_waits(monkeypatch) -> list:
    """The driver's waits on Ray that ran out (`ray.wait` answering nothing, `ray.get` timing out),
    each as its timeout, in order: a test of the watchdog counts its periods instead of timing them.
    Only for calls that do not poll (async mode's rollout polls with short waits that run out)."""
    import ray

    expired, wait, get = [], ray.wait, ray.get

    def counted_wait(refs, *args, **kwargs):
        ready, rest = wait(refs, *args, **kwargs)
        if not ready and kwargs.get("timeout"):
            expired.append(kwargs["timeout"])
        return ready, rest

    def counted_get(refs, *args, **kwargs):
        try:
            return get(refs, *args, **kwargs)
        except ray.exceptions.GetTimeoutError:
            expired.append(kwargs.get("timeout"))
            raise

    monkeypatch.setattr(ray, "wait", counted_wait)
    monkeypatch.setattr(ray, "get", counted_get)
    return expired


def choose_cpu_products(monkeypatch, choice: str) -> None:
    """This test's CPU products through `choice` (HFLOW_CPU_PRODUCTS), decided afresh: a new cache
    of `product_route.chosen_route` for the test, the process's own back after it."""
    import functools

    from hflow.engine.kernels import product_route

    monkeypatch.setenv(product_route.ENV, choice)
    monkeypatch.setattr(product_route, "chosen_route", functools.cache(product_route.chosen_route.__wrapped__))
