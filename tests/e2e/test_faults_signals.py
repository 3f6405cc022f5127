"""Faults from outside a live run: a second `hflow train --resume` of it, and SIGTERM (what
`timeout`, `docker stop`, Kubernetes and Slurm send), on the local and the Ray backend."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import assert_one_line_error, read_events, run_hflow, write_recipe

CRASH_TEXT = ("Traceback", "Stack", "SIGTERM received", "Fatal Python error", "core dumped", "Aborted")


def _start(recipe: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hflow", "train", str(recipe)], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _running(runs: Path, proc: subprocess.Popen, timeout: float = 240) -> Path:
    """The run directory once its status says running with at least one step done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        for status_file in runs.glob("*/status.json"):
            try:
                status = json.loads(status_file.read_text())
            except ValueError:
                continue  # replaced while read
            if status["status"] == "running" and status["step"] >= 1:
                return status_file.parent
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no step within {timeout} s: {proc.communicate()[1][-3000:]}")


def _terminate(proc: subprocess.Popen, run: Path) -> tuple[str, dict]:
    """SIGTERM the run; check it stopped as a signal stop should. Returns its stderr and status."""
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 143, stderr[-3000:]
    for text in CRASH_TEXT:
        assert text not in stderr, stderr[-3000:]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and status["error"] == "terminated (SIGTERM)", status
    last = stderr.strip().splitlines()[-1]
    assert last == (f"error: terminated (SIGTERM) after step {status['step']}; continue with: "
                    f"hflow train --resume {run}"), stderr[-3000:]
    steps = [e["step"] for e in read_events(run)]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= status["step"]
    complete = sorted(run.glob("checkpoints/step_*/COMPLETE"))
    assert complete and json.loads(complete[-1].read_text())["step"] >= status["step"]  # nothing lost
    return stderr, status


@pytest.mark.slow
def test_a_live_run_refuses_resume_and_stops_cleanly_on_sigterm(tmp_path, tiny_model):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model,
                          trainer={"total_steps": 1000, "save_every": 1, "output_dir": str(tmp_path / "runs")})
    proc = _start(recipe)
    try:
        run = _running(tmp_path / "runs", proc)
        second = run_hflow("train", "--resume", str(run))
        assert_one_line_error(second, f"--resume {run}", "still running",
                              f"pid {proc.pid} on {socket.gethostname()}", "run.lock", "kill -TERM")
        assert json.loads((run / "status.json").read_text())["pid"] == proc.pid  # the refused one wrote nothing
        _, status = _terminate(proc, run)
    finally:
        if proc.poll() is None:
            proc.kill()
    total = status["step"] + 2
    resumed = run_hflow("train", "--resume", str(run), "--set", f"trainer.total_steps={total}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e["step"] for e in read_events(run)] == list(range(1, total + 1))
    assert json.loads((run / "status.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_sigterm_on_an_async_run_cancels_its_generator_and_stops_cleanly(tmp_path, tiny_model):
    # The generator thread is mid-rollout when the signal comes: it must stop with the run (a
    # torch op still running in it as the process exits aborts it: exit 134, no status line).
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model,
                          trainer={"total_steps": 1000, "save_every": 1, "mode": "async", "max_staleness": 2,
                                   "output_dir": str(tmp_path / "runs")})
    proc = _start(recipe)
    try:
        run = _running(tmp_path / "runs", proc)
        stderr, _ = _terminate(proc, run)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "terminate called" not in stderr


@pytest.mark.slow
def test_sigterm_on_the_ray_backend_stops_without_a_stack_dump(tmp_path, tiny_model):
    proc = _start_on_ray(tmp_path, tiny_model)
    try:
        run = _running(tmp_path / "runs", proc)
        family = _family(proc)
        _terminate(proc, run)
    finally:
        if proc.poll() is None:
            proc.kill()
    _gone(family, within_s=30)  # Ray's processes stopped with the run


@pytest.mark.slow
def test_kill_9_on_the_ray_backend_leaves_no_ray_process_and_resumes(tmp_path, tiny_model):
    """kill -9 of hflow: Ray's processes end by Ray's own fate-sharing (the GCS, raylet and
    workers at once; its two agents about a minute later, see docs/runs.md), and the run resumes
    with every step once."""
    proc = _start_on_ray(tmp_path, tiny_model)
    try:
        run = _running(tmp_path / "runs", proc)
        family = _family(proc)
        assert {"raylet", "gcs_server"} <= {p.name() for p in family}, [p.name() for p in family]
    finally:
        proc.kill()
        proc.communicate()
    done = json.loads((run / "status.json").read_text())["step"]
    resumed = run_hflow("train", "--resume", str(run), "--set", f"trainer.total_steps={done + 2}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e["step"] for e in read_events(run)] == list(range(1, done + 3))
    _gone(family, within_s=120)


def _start_on_ray(tmp_path: Path, tiny_model: Path) -> subprocess.Popen:
    """A long run on the Ray backend, split over two CPU slots, checkpointing every step."""
    pytest.importorskip("ray")
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, cluster={"cpu_slots": 2},
                          placement={"backend": "ray", "mode": "split"},
                          trainer={"total_steps": 1000, "save_every": 1, "output_dir": str(tmp_path / "runs")})
    return _start(recipe)


def _family(proc: subprocess.Popen) -> list:
    """Every process the run started (Ray's GCS, raylet, agents and workers)."""
    psutil = pytest.importorskip("psutil")
    return psutil.Process(proc.pid).children(recursive=True)


def _gone(processes: list, within_s: float) -> None:
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=within_s)
    assert not alive, [(p.pid, p.name()) for p in alive]

