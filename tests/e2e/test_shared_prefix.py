"""Prompts that all begin with the same header, through the real CLI: the policy learns, and the
work the run computed stays near what its rows need with that header counted once a step, so the
header ran once in generation's prefill, once per optimizer step of the update and once per scoring
pass, not once per prompt."""

import json

import pytest

from helpers import finished_run, run_hflow

HEADER = "you are a careful assistant. answer with digits only. "


@pytest.mark.slow
def test_a_shared_header_runs_once_and_the_policy_learns(tmp_path):
    from hflow.trainer.data.tasks import make_rows

    rows = make_rows("digits", 256, seed=0)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({**row, "prompt": HEADER + row["prompt"]}) + "\n" for row in rows))
    result = run_hflow("train", "grpo/quickstart", "--output-dir", str(tmp_path / "runs"), "--set",
                       f"data.train={data}", "--set", "trainer.total_steps=24", "--set", "trainer.save_every=0",
                       cwd=tmp_path)
    _, events = finished_run(result, tmp_path)
    first = sum(e["reward/mean"] for e in events[:8]) / 8
    last = sum(e["reward/mean"] for e in events[-8:]) / 8
    assert last >= first + 0.3, (first, last)
    # The 54-character header, counted once a step in what the rows need: run once per prompt, the
    # prefill would compute about 1.4x what it needs, the update about 1.4x too (each prompt whole);
    # shared, 1.03-1.08 and 1.00-1.06 were measured (the update's two optimizer steps each run the
    # header, and the needed work counts it once each; 1.09-1.12 when it counted it once a step).
    # The scoring passes' four micro-batches hold the header's keys from the first (1.22 where each
    # ran it).
    for phase, most in (("generate", 1.2), ("update_actor", 1.1), ("old_log_prob", 1.1), ("reference", 1.1)):
        ratios = [e[f"work/{phase}/computed_flops"] / e[f"work/{phase}/needed_flops"] for e in events]
        assert all(1.0 <= r < most for r in ratios), (phase, ratios)
