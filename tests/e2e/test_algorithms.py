"""The shipped tiny recipes of PPO, ReMax and Safe-RLHF, through the real CLI: each one learns."""

import json
from pathlib import Path

import pytest

from helpers import read_events, run_hflow
from hflow.trainer.data.tasks import high_digit_share, score_digits


def _train(tmp_path: Path, recipe: str, *overrides: str) -> tuple[Path, list[dict], list[dict]]:
    result = run_hflow("train", recipe, "--output-dir", str(tmp_path / "runs"),
                       *[a for o in overrides for a in ("--set", o)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = Path(result.stdout.strip().splitlines()[-1])
    run = run if run.is_absolute() else tmp_path / run
    events = read_events(run)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    return run, events, samples


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def _first_last(events: list[dict], key: str, n: int = 10) -> tuple[float, float]:
    return _mean(e[key] for e in events[:n]), _mean(e[key] for e in events[-n:])


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny-reward-digits"
    result = run_hflow("init-model", "tiny-reward", str(out), "--task", "digits")
    assert result.returncode == 0, result.stderr[-3000:]
    card = json.loads((out / "hflow_scorer.json").read_text())
    assert card["held_out_pair_accuracy"] > 0.85  # the reward model means something
    return out


@pytest.mark.slow
def test_ppo_tiny_learns_with_a_reward_model(tmp_path, tiny_reward_model):
    run, events, samples = _train(tmp_path, "ppo/tiny", f"reward.model={tiny_reward_model}")
    assert [e["step"] for e in events] == list(range(1, 41))
    for key in ("critic/loss", "critic/vf_explained_var", "critic/grad_norm", "kl/coef", "kl/mean",
                "timing/values", "timing/update_critic"):
        assert all(key in e for e in events), key
    first, last = _first_last(events, "reward/mean")
    assert last > first + 2.0, (first, last)  # the reward model's own scale: about -2 -> 8
    loss_first, loss_last = _first_last(events, "critic/loss", 5)
    assert loss_last < 0.5 * loss_first, (loss_first, loss_last)
    # What the reward model stands for moved too: more digits in the sampled responses.
    digits = [score_digits(s["response"], "") for s in samples]
    assert _mean(digits[-10:]) > _mean(digits[:10]) + 0.3
    assert {"actor", "critic"} <= {p.name for p in (run / "checkpoints" / "step_000040").iterdir()}


@pytest.mark.slow
def test_remax_tiny_learns(tmp_path):
    _, events, _ = _train(tmp_path, "remax/tiny")
    assert all("reward/baseline_mean" in e and "timing/generate_greedy" in e for e in events)
    first, last = _first_last(events, "reward/mean")
    assert last > first + 0.3, (first, last)


@pytest.mark.slow
def test_safe_rlhf_tiny_trades_reward_against_its_cost_limit(tmp_path):
    _, events, samples = _train(tmp_path, "safe_rlhf/tiny")
    limit = 0.02
    first, last = _first_last(events, "reward/mean")
    assert last > first + 0.3, (first, last)
    # lambda moves with the sign of (mean episode cost - limit), every step (the window is one step).
    lambdas = [0.5] + [e["lagrange/lambda"] for e in events]
    rises = falls = 0
    for e, before, after in zip(events, lambdas, lambdas[1:]):
        assert e["lagrange/episode_cost"] == pytest.approx(e["cost/mean"])
        if e["cost/mean"] > limit:
            assert after > before, e["step"]
            rises += 1
        elif e["cost/mean"] < limit:
            assert after < before, e["step"]
            falls += 1
    assert rises >= 3 and falls >= 3
    peak = lambdas.index(max(lambdas))
    assert 0 < peak < len(lambdas) - 1  # it went up, then came down
    assert _mean(e["cost/mean"] for e in events[-10:]) < min(limit, events[0]["cost/mean"])
    assert _mean(high_digit_share(s["response"]) for s in samples[-10:]) < limit + 0.05
