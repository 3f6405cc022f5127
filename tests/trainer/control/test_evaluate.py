"""Evaluation: the metrics by hand, the arithmetic task's held-out split, and eval data checks."""

from __future__ import annotations

import json

import pytest
import torch

from hflow.errors import UserError
from hflow.trainer.data import rewards, tasks
from hflow.trainer.data.rows import read_eval_rows
from hflow.trainer.control.evaluate import eval_metrics
from hflow.trainer.config.sections import DataConfig


def test_metrics_by_hand_one_sample():
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0])
    lengths = torch.tensor([3, 5, 8, 4])
    m = eval_metrics(scores, lengths, n=1)
    assert m == {"eval/reward": 0.625, "eval/accuracy": 0.5, "eval/response_length": 5.0}


def test_metrics_by_hand_pass_at_n():
    # 3 prompts x 2 samples: prompt 0 right once, prompt 1 never (0.5 is not right), prompt 2 twice.
    scores = torch.tensor([0.0, 1.0, 0.5, 0.0, 1.0, 1.0])
    m = eval_metrics(scores, torch.full((6,), 2), n=2)
    assert m["eval/accuracy"] == pytest.approx(3 / 6)
    assert m["eval/pass@2"] == pytest.approx(2 / 3)
    assert m["eval/reward"] == pytest.approx(3.5 / 6)


def test_arithmetic_held_out_split_is_disjoint_and_fixed():
    train = set(tasks.arithmetic_problems("train"))
    held_out = set(tasks.arithmetic_problems("eval"))
    assert train and held_out and not train & held_out
    assert len(held_out) / (len(train) + len(held_out)) == pytest.approx(1 / tasks.EVAL_SHARE, abs=0.05)
    trained_prompts = {json.dumps(r["prompt"]) for r in tasks.make_rows("arithmetic", 4096, seed=1)}
    eval_rows = tasks.make_rows("arithmetic", 128, seed=1, split="eval")
    assert len({json.dumps(r["prompt"]) for r in eval_rows}) == 128  # distinct problems
    assert not trained_prompts & {json.dumps(r["prompt"]) for r in eval_rows}
    assert tasks.make_rows("arithmetic", 8, seed=3, split="eval") == tasks.make_rows("arithmetic", 8, 3, "eval")


def test_arithmetic_rows_and_score():
    row = tasks._arithmetic_row((12, "+", 7))
    assert row == {"prompt": [{"role": "user", "content": "What is 12 + 7? Answer with a number."}], "answer": "19",
                   "question": "12 + 7"}  # `question`: for an eval set's own template
    assert tasks._arithmetic_row((9, "-", 12 - 3))["answer"] == "0"
    assert tasks._arithmetic_row((4, "*", 11))["answer"] == "44"
    assert tasks.score("arithmetic", "12 + 7 = 19.", "19") == 1.0
    assert tasks.score("arithmetic", "19 is the sum of 12 and 7", "19") == 0.0  # the LAST number counts
    assert tasks.score("arithmetic", "The answer is 190", "19") == 0.0
    assert rewards.synthetic([""], ["= 19"], task=["arithmetic"], answer=["19"]) == [1.0]
    assert rewards.exact_match([""], ["so #### 1,234"], answer=["1234"]) == [1.0]


def test_existing_tasks_keep_their_rows():
    """The rows of the tasks that existed before arithmetic, for seed 7 (seeded runs must not change)."""
    assert [r["prompt"] for r in tasks.make_rows("digits", 4, 7)] == [
        "list digits: ", "print digits: ", "make digits: ", "write digits: "]
    assert [r["answer"] for r in tasks.make_rows("letter", 4, 7)] == ["k", "e", "m", "u"]
    assert [r["answer"] for r in tasks.make_rows("echo", 4, 7)] == ["emu", "cr", "ls", "qg"]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_eval_file_needs_the_reward_columns(tmp_path):
    spec = _write(tmp_path / "eval.jsonl", [{"question": "1+1?", "answer": "2"}, {"question": "2+2?"}])
    cfg = DataConfig(train="synthetic:digits", eval=spec, prompt_key="question")
    with pytest.raises(UserError, match=r"row 2 has no column 'answer'.*exact_match"):
        read_eval_rows(cfg, "exact_match", seed=0)
    with pytest.raises(UserError, match=r"row 1 has no column 'task'"):
        read_eval_rows(cfg, "synthetic", seed=0)
    assert [r["prompt"] for r in read_eval_rows(cfg, "length", seed=0)] == ["1+1?", "2+2?"]
    capped = DataConfig(train="synthetic:digits", eval=spec, prompt_key="question", eval_size=1)
    assert len(read_eval_rows(capped, "exact_match", seed=0)) == 1
    with pytest.raises(UserError, match="no column 'prompt'"):
        read_eval_rows(DataConfig(train="synthetic:digits", eval=spec), None, seed=0)
    with pytest.raises(UserError, match="unknown synthetic task"):
        read_eval_rows(DataConfig(train="synthetic:digits", eval="synthetic:nope"), None, seed=0)


def test_synthetic_eval_size():
    cfg = DataConfig(train="synthetic:arithmetic", eval="synthetic:arithmetic", eval_size=10)
    assert len(read_eval_rows(cfg, "synthetic", seed=0)) == 10
    every = DataConfig(train="synthetic:arithmetic", eval="synthetic:arithmetic", eval_size=100000)
    assert len(read_eval_rows(every, "synthetic", seed=0)) == len(tasks.arithmetic_problems("eval"))
