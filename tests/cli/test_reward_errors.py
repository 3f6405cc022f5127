"""A user's reward function that raises, cannot be imported, or returns NaN ends `hflow train`
on the local backend with one line naming the recipe key and the function, exit 2 (a UserError,
the same line on the ray backend), status.json failed and the last checkpoint intact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import read_events, run_hflow, write_recipe

TESTS = Path(__file__).resolve().parents[1]


def _train(tmp_path: Path, tiny_model: Path, function: str, extra_path: Path | None = None):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, reward={"function": function},
                          rollout={"n": 2, "max_response_length": 4},
                          actor={"micro_batch_size": 4, "mini_batch_size": 4},
                          trainer={"total_steps": 3, "save_every": 1, "prompts_per_step": 2})
    paths = [str(extra_path)] if extra_path else []
    env = {"PYTHONPATH": os.pathsep.join(paths + [str(TESTS), os.environ.get("PYTHONPATH", "")])}
    result = run_hflow("train", str(recipe), env=env, timeout=300)
    run = next((tmp_path / "runs").glob("test-*"), None)
    return result, run, json.loads((run / "status.json").read_text()) if run else None


def _failed_after_step_1(result, run: Path, status: dict, line: str) -> None:
    """The run stopped at step 2 with `line`: status failed at step 1, step 1's checkpoint intact."""
    assert _last_line(result) == f"error: {line}"
    assert status["status"] == "failed" and status["step"] == 1 and status["error"] == line
    assert (run / "checkpoints" / "step_000001" / "COMPLETE").exists()


def _last_line(result) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow  # two steps through the CLI
def test_a_raising_reward_function_is_one_line(tmp_path, tiny_model):
    result, run, status = _train(tmp_path, tiny_model, "faulty_rewards:raises_at_second_call")
    line = ("reward.function 'faulty_rewards:raises_at_second_call' raised ValueError: "
            "the reward service is down")
    _failed_after_step_1(result, run, status, line)
    assert "faulty_rewards.py" in (run / "train.log").read_text()  # the function's traceback, for its author


def test_a_reward_module_with_a_syntax_error_is_one_line(tmp_path, tiny_model):
    """Imported when the inputs are checked: one line, and no run directory is made for it."""
    (tmp_path / "typo_reward.py").write_text("def score(prompts, responses:\n    return [1.0]\n")
    result, run, _ = _train(tmp_path, tiny_model, "typo_reward:score", extra_path=tmp_path)
    # the module beside the recipe is named by its file (`locate_code`)
    assert _last_line(result).startswith(f"error: reward.function '{tmp_path / 'typo_reward.py'}:score': "
                                         "importing module 'typo_reward' raised SyntaxError: ")
    assert run is None


@pytest.mark.slow  # two steps through the CLI
def test_a_nan_reward_stops_the_run_by_default(tmp_path, tiny_model):
    result, run, status = _train(tmp_path, tiny_model, "faulty_rewards:one_nan_at_second_call")
    line = ("reward.function 'faulty_rewards:one_nan_at_second_call' returned 1 non-finite score of 4 at "
            "step 2 (nan); set trainer.on_nonfinite: skip_step to skip such steps")
    _failed_after_step_1(result, run, status, line)
    assert [e["step"] for e in read_events(run)] == [1]
    assert not (run / "checkpoints" / "step_000002").exists()


@pytest.mark.slow  # two steps through the CLI
def test_a_hung_reward_function_on_the_local_backend_stops_at_the_watchdog(tmp_path, tiny_model):
    """trainer.worker_timeout_s watches the reward function on the local backend too: the run
    stops in one line naming the function and the timeout (exit 1, as the ray backend's watchdog),
    instead of hanging until someone stops it."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, reward={"function": "faulty_rewards:hangs_at_second_call"},
                          rollout={"n": 2, "max_response_length": 4},
                          actor={"micro_batch_size": 4, "mini_batch_size": 4},
                          placement={"backend": "local"},
                          trainer={"total_steps": 3, "save_every": 1, "prompts_per_step": 2, "worker_timeout_s": 5})
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    result = run_hflow("train", str(recipe), env=env, timeout=240)  # a hang: TimeoutExpired
    line = ("reward.function 'faulty_rewards:hangs_at_second_call' gave no answer within 5 s "
            "(trainer.worker_timeout_s): it hangs (a service it waits for, a loop that does not end); the run stopped")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    run = next((tmp_path / "runs").glob("test-*"))
    assert result.stderr.strip().splitlines()[-1] == f"error: {line} (run directory: {run})"
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and status["step"] == 1 and status["error"] == line
    assert (run / "checkpoints" / "step_000001" / "COMPLETE").exists()
