"""The shipped tiny recipes of RLOO, REINFORCE++ (+baseline), GSPO and DAPO (#15), through the
real CLI: each one learns (reward/mean rises), and `--resume` after a crash continues exactly."""

import os
from pathlib import Path

import pytest

from helpers import finished_run, read_events, resume_after_crash, run_hflow

# Per recipe: the rise of reward/mean (mean of the last 10 steps minus the first 10) it must
# show. The synthetic digits reward is in [0, 1] and starts near 0.15; DAPO's also carries
# the overlong penalty (<= 0).
RECIPES = {
    "rloo/tiny": 0.3,
    "reinforce_pp/tiny": 0.3,
    "reinforce_pp/tiny_baseline": 0.3,
    "gspo/tiny": 0.3,
    "cispo/tiny": 0.3,
    "dapo/tiny": 0.3,
}
COMPARED = ["reward/mean", "entropy/mean", "response_length/mean", "actor/loss", "actor/pg_loss",
            "actor/grad_norm", "actor/lr"]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_tiny_recipe_learns_and_resumes_exactly(tmp_path, recipe):
    # Checkpoints at steps 35 and 40; the crash comes after step 37, so the resume re-runs 36-40.
    result = run_hflow("train", recipe, "--output-dir", str(tmp_path / "runs"),
                       "--set", "trainer.save_every=35", cwd=tmp_path)
    run, events = finished_run(result, tmp_path)
    assert [e["step"] for e in events] == list(range(1, 41))
    first, last = _mean(e["reward/mean"] for e in events[:10]), _mean(e["reward/mean"] for e in events[-10:])
    print(f"{recipe}: reward/mean first 10 steps {first:.3f} -> last 10 steps {last:.3f}")
    assert last > first + RECIPES[recipe], (first, last)
    if recipe == "dapo/tiny":
        for key in ("dapo/sampling_rounds", "dapo/dropped_groups", "dapo/filled_groups",
                    "dapo/overlong_penalty_mean"):
            assert all(key in e for e in events), key
        assert all(1 <= e["dapo/sampling_rounds"] <= 3 for e in events)
        assert all(e["dapo/overlong_penalty_mean"] <= 0 for e in events)
    compared = COMPARED + [k for k in events[0] if k.startswith("dapo/")]

    again = resume_after_crash(run, crashed_after=37, last=40)
    assert [e["step"] for e in again] == list(range(1, 41))
    for before, after in zip(events[35:], again[35:]):
        for key in compared:
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), (after["step"], key)


@pytest.mark.slow
def test_dapo_at_its_sampling_cap_fills_the_step_with_dropped_groups(tmp_path):
    """A reward that never varies: every round drops every group, the cap (3 rounds) is hit, and
    the step is filled with dropped groups, whose advantage is 0, so the policy loss is 0."""
    tests = Path(__file__).resolve().parents[1]
    env = {"PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    result = run_hflow("train", "dapo/tiny", "--output-dir", str(tmp_path / "runs"),
                       "--set", "reward.function=faulty_rewards:constant", "--set", "dapo.overlong_buffer=0",
                       "--set", "trainer.total_steps=2", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    run = next((tmp_path / "runs").glob("dapo-tiny-*"))
    for event in read_events(run):
        assert event["dapo/sampling_rounds"] == 3 and event["dapo/dropped_groups"] == 3 * 8, event
        assert event["dapo/filled_groups"] == 8 and event["reward/mean"] == 1.0, event
        assert event["actor/pg_loss"] == 0, event
