"""Asynchronous mode (`trainer.mode: async`) through the real CLI: max_staleness 0 is the
synchronous run exactly; the shipped tiny async recipe learns within its staleness bound; and a
resume neither loses nor repeats a prompt."""

import json
from collections import defaultdict
from pathlib import Path

import pytest

from helpers import RUN_VARYING, finished_run, resume_after_crash, run_hflow, train_run, write_recipe

# What differs between the two modes by design: wall-clock times, the memory the generator copy
# adds, and the async/* metrics.
NOT_COMPARED = (*RUN_VARYING, "async/")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, correction", [("grpo", "none"), ("gspo", "tis")])
def test_max_staleness_0_reproduces_the_synchronous_run(tmp_path, tiny_model, algorithm, correction):
    events = {}
    for mode in ("sync", "async"):
        recipe = write_recipe(tmp_path / f"{mode}.yaml", tiny_model, algorithm=algorithm,
                              actor={"lr": 0.002, "micro_batch_size": 16, "mini_batch_size": 16,
                                     "off_policy_correction": correction},
                              trainer={"total_steps": 3, "prompts_per_step": 8, "save_every": 0, "mode": mode,
                                       "max_staleness": 0, "output_dir": str(tmp_path / mode)})
        _, events[mode] = train_run(recipe)
    sync, async_ = events["sync"], events["async"]
    assert [e["step"] for e in async_] == [1, 2, 3]
    for want, got in zip(sync, async_):
        compared = [k for k in want if not k.startswith(NOT_COMPARED)]
        assert "actor/loss" in compared and "reward/mean" in compared
        assert {k: got[k] for k in compared} == {k: want[k] for k in compared}, want["step"]
        assert got["async/staleness_max"] == 0 and got["async/policy_version"] == got["step"] - 1
    assert sync[0]["actor/loss"] != sync[-1]["actor/loss"]  # the policy moved between steps
    if correction != "none":
        assert all("actor/off_policy_weight" in e for e in async_)


def _prompts_by_step(run: Path) -> dict[int, list[str]]:
    by_step = defaultdict(list)
    for line in (run / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_step[row["step"]].append(row["prompt"])
    return dict(by_step)


@pytest.mark.slow
def test_tiny_async_recipe_learns_within_its_bound_and_resumes_without_losing_a_prompt(tmp_path):
    # Every row in samples.jsonl (8 prompts x n = 4), so that each step's prompts can be compared.
    result = run_hflow("train", "grpo/tiny_async", "--output-dir", str(tmp_path / "runs"),
                       "--set", "trainer.save_every=35", "--set", "logging.samples_per_step=32", cwd=tmp_path)
    run, events = finished_run(result, tmp_path)
    assert [e["step"] for e in events] == list(range(1, 41))
    first = sum(e["reward/mean"] for e in events[:10]) / 10
    last = sum(e["reward/mean"] for e in events[-10:]) / 10
    assert last > first + 0.3, (first, last)
    # Every step trains within max_staleness: 1, and rollout did run ahead of training.
    assert all(e["async/staleness_max"] <= 1 and e["async/policy_version"] == e["step"] - 1 for e in events)
    assert max(e["async/staleness_max"] for e in events) == 1
    for key in ("async/staleness_mean", "async/queue_depth", "async/generate_busy_s", "async/generate_idle_s",
                "async/train_busy_s", "async/train_idle_s", "actor/off_policy_weight"):
        assert all(key in e for e in events), key
    # The generator's work runs ahead of training, and each step reports the work of its own rollout
    # (never part of the next one's): computed at least what its rows need, with no more than the
    # padding and finished-row waste of one rollout (a race once gave steps 0.73x and 1.27x).
    ratios = [e["work/generate/computed_flops"] / e["work/generate/needed_flops"] for e in events]
    assert all(1.0 <= r < 1.25 for r in ratios), ratios
    prompts = _prompts_by_step(run)

    # A crash after step 37 with the last checkpoint at 35: the rollouts that were in flight are
    # regenerated from the checkpoint's weights; each step trains the same prompts, once.
    again = resume_after_crash(run, crashed_after=37, last=40)
    assert [e["step"] for e in again] == list(range(1, 41))
    assert again[35]["async/staleness_max"] == 0  # step 36 came from the checkpoint's policy (version 35)
    assert _prompts_by_step(run) == prompts
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
