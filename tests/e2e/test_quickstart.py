"""The shipped quickstart, through the real CLI: the policy learns."""

import json
import os
from pathlib import Path

import pytest

from helpers import read_events, run_hflow

REQUIRED = ["step", "time", "reward/mean", "reward/std", "kl/mean", "entropy/mean", "response_length/mean",
            "actor/loss", "actor/grad_norm", "actor/lr", "timing/generate", "timing/reference",
            "timing/reward", "timing/advantage", "timing/update_actor", "throughput/tokens_per_s",
            "memory/peak_bytes"]


@pytest.mark.slow
def test_quickstart_learns(tmp_path):
    result = run_hflow("train", "grpo/quickstart", "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = Path(result.stdout.strip().splitlines()[-1])  # the run directory is the last line
    assert "built successfully" not in result.stdout  # DeepSpeed's note on loading its CPU op
    run = run if run.is_absolute() else tmp_path / run
    events = read_events(run)
    assert [e["step"] for e in events] == list(range(1, 61))
    for key in REQUIRED:
        assert all(key in e for e in events), key
    if (os.cpu_count() or 1) > 1 and "OMP_NUM_THREADS" not in os.environ:
        # A 0.1M-parameter model runs on one thread (trainer/placement/cpu_share.py).
        assert all(e["cpu/threads"] == 1.0 for e in events)
    first = sum(e["reward/mean"] for e in events[:10]) / 10
    last = sum(e["reward/mean"] for e in events[-10:]) / 10
    assert last >= first + 0.2, (first, last)
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "finished" and status["step"] == 60
    assert (run / "checkpoints" / "step_000060" / "COMPLETE").exists()
    assert (run / "final" / "model.safetensors").exists()
    assert json.loads((run / "plan.json").read_text())["roles"]["actor"]["pool"] == "pool0"
    assert "grpo" in (run / "recipe.yaml").read_text()
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and {"step", "prompt", "response", "reward"} <= set(samples[0])
