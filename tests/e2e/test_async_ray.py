"""Asynchronous mode on the ray backend through the real CLI: the rollout role generates on a
pool of its own within the staleness bound and the run learns; max_staleness 0 is the
synchronous split run exactly; a worker killed in either pool ends the run in one line (not at
the watchdog's timeout), and the run resumes from its checkpoint with every step trained once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import RUN_VARYING, finished_run, read_events, run_hflow, train_run, write_recipe

pytest.importorskip("ray")
pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parents[1]
RAY_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
SPLIT = ["--set", "placement.backend=ray", "--set", "placement.mode=split", "--set", "cluster.cpu_slots=2"]
NOT_COMPARED = (*RUN_VARYING, "async/")


def test_async_on_ray_generates_on_a_pool_of_its_own_and_learns_within_the_bound(tmp_path):
    result = run_hflow("train", "grpo/tiny_async", "--output-dir", str(tmp_path / "runs"), *SPLIT,
                       "--set", "trainer.total_steps=16", "--set", "trainer.save_every=0", cwd=tmp_path, env=RAY_ENV)
    run, events = finished_run(result, tmp_path)
    plan = json.loads((run / "plan.json").read_text())
    assert {p["name"]: sorted(p["roles"]) for p in plan["pools"]} == {
        "train": ["actor", "reference", "reward"], "rollout": ["rollout"]}
    pids = {p["name"]: [w["pid"] for w in p["processes"]] for p in plan["pools"]}
    assert len(set(pids["train"] + pids["rollout"])) == 2  # two processes: one per pool
    assert [e["step"] for e in events] == list(range(1, 17))
    assert all(e["async/staleness_max"] <= 1 and e["async/policy_version"] == e["step"] - 1 for e in events)
    assert max(e["async/staleness_max"] for e in events) == 1  # rollout did run ahead
    first = sum(e["reward/mean"] for e in events[:4]) / 4
    last = sum(e["reward/mean"] for e in events[-4:]) / 4
    assert last > first + 0.1, (first, last)


def test_max_staleness_0_on_ray_reproduces_the_synchronous_split_run(tmp_path, tiny_model):
    _assert_staleness_0_is_sync(tmp_path, tiny_model, {"lr": 0.002, "micro_batch_size": 16, "mini_batch_size": 16})


def test_async_with_vllm_on_its_own_pool_at_staleness_0_reproduces_the_synchronous_vllm_run(
        tmp_path, tiny_model, real_vllm):
    # The rollout worker's vLLM gets the weights bucket by bucket through the object store; with
    # max_staleness 0 it samples what the actor's own (hybrid) vLLM samples in the sync run.
    _assert_staleness_0_is_sync(tmp_path, tiny_model, {"lr": 0.002, "micro_batch_size": 16, "mini_batch_size": 16,
                                                       "recompute_old_log_probs": True},
                                rollout={"engine": "vllm", "n": 4, "max_response_length": 8})


def _assert_staleness_0_is_sync(tmp_path: Path, model: Path, actor: dict, **sections) -> None:
    """The same recipe on ray split pools, sync and async at max_staleness 0: the same events."""
    events = {}
    for mode in ("sync", "async"):
        recipe = write_recipe(tmp_path / f"{mode}.yaml", model, actor=actor,
                              placement={"backend": "ray", "mode": "split"}, cluster={"cpu_slots": 2},
                              trainer={"total_steps": 3, "prompts_per_step": 8, "save_every": 0, "mode": mode,
                                       "max_staleness": 0, "output_dir": str(tmp_path / mode)}, **sections)
        _, events[mode] = train_run(recipe)
    for want, got in zip(events["sync"], events["async"], strict=True):
        compared = [k for k in want if not k.startswith(NOT_COMPARED)]
        assert "actor/loss" in compared and "kl/mean" in compared
        assert {k: got[k] for k in compared} == {k: want[k] for k in compared}, want["step"]
        assert got["async/staleness_max"] == 0
    assert events["sync"][0]["actor/loss"] != events["sync"][-1]["actor/loss"]


def test_a_killed_worker_in_either_pool_ends_the_run_in_one_line_and_it_resumes(tmp_path, tiny_model):
    # The rollout pool's worker is killed after step 3, the run resumed, the training pool's
    # worker killed after step 5, the run resumed again: it finishes with every step trained once.
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, reward={"function": "faulty_rewards:slow"},
                          placement={"backend": "ray", "mode": "split"}, cluster={"cpu_slots": 2},
                          logging={"progress": "lines", "samples_per_step": 32},
                          trainer={"total_steps": 7, "prompts_per_step": 8, "save_every": 2, "mode": "async",
                                   "max_staleness": 1, "output_dir": str(tmp_path / "runs")})
    run = _kill_after(["train", str(recipe)], tmp_path, "rollout", steps=3, role="rollout")
    assert (run / "checkpoints" / "step_000002" / "COMPLETE").exists()
    _kill_after(["train", "--resume", str(run)], tmp_path, "train", steps=5, role="(actor|reward|reference)")
    assert (run / "checkpoints" / "step_000004" / "COMPLETE").exists()

    resumed = run_hflow("train", "--resume", str(run), env=RAY_ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = read_events(run)
    assert [e["step"] for e in events] == list(range(1, 8))  # every step once: none lost, none twice
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [sum(s["step"] == step for s in samples) for step in range(1, 8)] == [32] * 7
    assert all(e["async/staleness_max"] <= 1 for e in events)


def _kill_after(args: list[str], cwd: Path, pool: str, steps: int, role: str) -> Path:
    """Start `hflow ARGS`, SIGKILL the worker of `pool` once the run logged `steps` steps, and check
    the run ends in seconds with one line naming the dead worker (`role`, a pattern), status
    failed. Returns the run directory."""
    proc = subprocess.Popen([sys.executable, "-m", "hflow", *args], cwd=cwd, env={**os.environ, **RAY_ENV},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run = _wait_for_steps(cwd / "runs", steps, proc)
        plan = json.loads((run / "plan.json").read_text())
        (victim,) = [w["pid"] for p in plan["pools"] if p["name"] == pool for w in p["processes"]]
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)  # a run that waited on its dead worker fails here
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    assert_matches(stderr.strip().splitlines()[-1], rf"error: {role} worker rank 0 failed: its process died "
                                                     rf"\(killed, crashed or out of memory\) \(run directory: {run}\)")
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "its process died" in status["error"]
    return run


def assert_matches(line: str, pattern: str) -> None:
    import re

    assert re.fullmatch(pattern, line), line


def _wait_for_steps(runs: Path, steps: int, proc: subprocess.Popen) -> Path:
    """The run directory once its events.jsonl holds `steps` steps (the run still going)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        for run in runs.glob("*"):
            events = run / "events.jsonl"
            if events.exists() and len(events.read_text().splitlines()) >= steps and (run / "plan.json").exists():
                return run
        time.sleep(0.1)
    raise AssertionError(f"no {steps} steps within 180 s")
