"""The held-out sets of `eval.sets`: answer extraction, templates, the built-in arithmetic variants,
the per-prompt metrics of one pass (by hand, through a scripted actor) and the 95% intervals."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pydantic import ValidationError

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.errors import UserError
from hflow.trainer.config.eval_section import EvalConfig, EvalSet
from hflow.trainer.config.sections import DataConfig
from hflow.trainer.control.evaluate import HeldOut, Evaluator, cut_off
from hflow.trainer.data import tasks
from hflow.trainer.data.answers import extract, is_right, same_answer
from hflow.trainer.data.eval_sets import read_set_rows, template_fields
from hflow.trainer.data.rows import read_rows
from hflow.trainer.report.intervals import interval, paired_difference, wilson


def test_extraction_rules_by_hand():
    assert extract("last_number", "12 + 7 = 19.") == "19"
    assert extract("last_number", "5 apples, so #### 1,234") == "1234"
    assert extract("last_number", "no digits here") is None
    assert extract("boxed", r"first \boxed{2}, then \boxed{\frac{1}{2}} ok") == r"\frac{1}{2}"
    assert extract("boxed", r"\boxed{unclosed") is None
    assert extract("exact", "  Paris \n") == "Paris"
    assert extract(r"regex:answer: (\w+)", "answer: no ... answer: yes") == "yes"  # the last match
    assert extract(r"regex:\d+", "a 3 b 44") == "44"  # no group: the whole match
    assert same_answer("1,000", "1000.0") and same_answer(" PARIS", "paris") and not same_answer("19", "190")
    assert not same_answer(None, "1") and not is_right("last_number", "nothing", "0")


def test_set_config_is_checked():
    assert EvalSet(name="wide", data="synthetic:arithmetic_wide").extract == "reward"
    for bad, message in (({"name": "accuracy"}, "data.eval's own metrics"), ({"name": "a/b"}, "letters, digits"),
                         ({"extract": "regex:(unclosed"}, "does not compile"),
                         ({"extract": "first"}, "accepted: reward")):
        with pytest.raises(ValidationError, match=message):
            EvalSet(**{"name": "s", "data": "x.jsonl", **bad})
    with pytest.raises(ValidationError, match="'s' is used twice"):
        EvalConfig(sets=[{"name": "s", "data": "a.jsonl"}, {"name": "s", "data": "b.jsonl"}])


def test_templates_read_plain_columns_only():
    assert template_fields("Q: {question}\n{{literal}} A:", "t") == ["question"]
    for bad in ("{question.__class__}", "{0}", "{question!r}", "{question:>9}", "{unclosed"):
        with pytest.raises(UserError, match="eval.sets 'x' template"):
            template_fields(bad, "eval.sets 'x' template")


def test_arithmetic_variants_are_held_out_from_training():
    trained = {tuple(p) for p in tasks.arithmetic_problems("train")}
    training_prompts = {json.dumps(r["prompt"]) for r in tasks.make_rows("arithmetic", 4096, seed=1)}
    rephrased = tasks.make_rows("arithmetic_rephrased", 128, seed=1, split="eval")
    same = tasks.make_rows("arithmetic", 128, seed=1, split="eval")
    # the same held-out problems as the plain set, in other words (and never a training prompt)
    assert [r["answer"] for r in rephrased] == [r["answer"] for r in same]
    assert all(not r["prompt"][0]["content"].startswith("What is") for r in rephrased)
    assert len({r["prompt"][0]["content"].split()[0] for r in rephrased}) >= 4  # several phrasings
    assert not training_prompts & {json.dumps(r["prompt"]) for r in rephrased}
    wide = tasks.wide_problems("eval")
    assert not set(wide) & trained and tasks.wide_problems("train") == []
    assert all(min(a, b) > 30 if op in "+-" else b > 12 for a, op, b in wide)
    products = tasks.multiply_wide_problems("eval")
    assert all(a >= 100 for a, _, _ in products) and not set(products) & set(tasks.multiply_problems("train"))
    with pytest.raises(UserError, match="for evaluation only; train on synthetic:arithmetic"):
        read_rows(DataConfig(train="synthetic:arithmetic_wide"), seed=0)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_set_rows_from_a_file_and_a_template(tmp_path):
    data = _write(tmp_path / "q.jsonl", [{"question": "2+2", "solution": "4"}, {"question": "3+3", "solution": "6"}])
    held_out = EvalSet(name="mine", data=data, template="Compute {question}.", extract="last_number",
                       answer_key="solution", size=1)
    (row,) = read_set_rows(held_out, "exact_match", seed=0)  # size 1: the first row
    assert row[col.PROMPT] == [{"role": "user", "content": "Compute 2+2."}] and row["solution"] == "4"
    plain = EvalSet(name="mine", data=data, template="Q: {question} A:", chat=False, extract="last_number",
                    answer_key="solution")
    assert [r[col.PROMPT] for r in read_set_rows(plain, None, 0)] == ["Q: 2+2 A:", "Q: 3+3 A:"]
    with pytest.raises(UserError, match="eval.sets 'mine' template: row 1 .* has no column 'topic'"):
        read_set_rows(EvalSet(name="mine", data=data, template="{topic}"), None, 0)
    with pytest.raises(UserError, match="row 1 has no 'answer' .*extract 'last_number'"):
        read_set_rows(EvalSet(name="mine", data=data, prompt_key="question", extract="last_number"), None, 0)
    with pytest.raises(UserError, match="row 1 has no column 'task'.*synthetic"):  # scored by the reward
        read_set_rows(EvalSet(name="mine", data=data, prompt_key="question"), "synthetic", 0)
    synthetic = EvalSet(name="w", data="synthetic:arithmetic_wide", size=5, template="{question} =", chat=False)
    assert all(r[col.PROMPT].endswith(" =") and "answer" in r for r in read_set_rows(synthetic, "synthetic", 0))


def test_cut_off_is_a_full_length_response_without_an_end():
    eos = [9]
    responses = torch.tensor([[1, 2, 3], [1, 2, 9], [1, 9, 0], [4, 5, 6]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 1]])  # row 3: a tool's tokens unscored inside
    assert cut_off(responses, mask, 3, eos).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert cut_off(responses, mask, 2, eos).tolist() == [1.0, 0.0, 0.0, 1.0]


class _Actor:
    """Answers every prompt with the scripted texts, in turn; a token is a character."""

    world_size = 2

    def __init__(self, texts: list[str]):
        self.texts, self.calls = texts, []

    def generate_sequences(self, prompts: Batch) -> Batch:
        sampling = prompts.meta["eval"]
        self.calls.append(dict(sampling))
        n, width = sampling["n"], sampling["max_response_length"]
        rows = len(prompts[col.UID]) * n
        texts = [self.texts[i % len(self.texts)] for i in range(rows)]
        ids = torch.zeros(rows, width, dtype=torch.long)
        mask = torch.zeros(rows, width, dtype=torch.long)
        for i, text in enumerate(texts):
            ids[i, :len(text)] = torch.tensor([ord(c) for c in text[:width]])
            mask[i, :len(text)] = 1
        return prompts.repeat(n) | Batch({col.RESPONSES: ids, col.RESPONSE_MASK: mask})


class _Chars:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_one_set_greedy_and_sampled_by_hand():
    evaluator = Evaluator.__new__(Evaluator)
    evaluator.tokenizer, evaluator.eos = _Chars(), [ord("!")]
    rows = [{"answer": "4", col.PROMPT: "2+2"}, {"answer": "6", col.PROMPT: "3+3"}, {"answer": "8", col.PROMPT: "4+4"}]
    held_out = HeldOut("eval/mine/", rows, [("greedy", {"n": 1, "temperature": 0.0, "max_response_length": 4}),
                                            ("sampled", {"n": 2, "temperature": 1.0, "max_response_length": 4,
                                                         "stream": "eval/mine"})], "last_number")
    evaluator.sets = [held_out]
    # greedy: prompt 1 "4!" right, 2 "= 6" right, 3 "12345" wrong and cut at 4 ("1234");
    # sampled (2 each, in turn): p1 "4!" "= 6" -> 1/2, p2 "1234" "4!" -> 0/2, p3 "= 6" "1234" -> 0/2
    actor = _Actor(["4!", "= 6", "12345"])
    values = evaluator.outcomes(actor, reward=None, step=3)["eval/mine/"]
    assert values["accuracy"].tolist() == [1.0, 1.0, 0.0]
    assert values["response_length"].tolist() == [2.0, 3.0, 4.0]
    assert values["cutoff_share"].tolist() == [0.0, 0.0, 1.0]
    assert values["mean@2"].tolist() == [0.5, 0.0, 0.0] and values["pass@2"].tolist() == [1.0, 0.0, 0.0]
    assert "reward" not in values  # scored by extraction, not by the reward role
    assert [c["n"] for c in actor.calls] == [1, 2] and actor.calls[1]["stream"] == "eval/mine"


class _ToolActor(_Actor):
    """Episodes too: the first prompt's turn was cut by max_turn_tokens, the second ran out of room."""

    def generate_sequences(self, prompts: Batch) -> Batch:
        batch = super().generate_sequences(prompts)
        episodes = [{"turns": [{"tokens": 2, "cut": True}], "ended": "done", "return": 0.0, "tool_calls": 1},
                    {"turns": [{"tokens": 2, "cut": False}], "ended": "max_tokens", "return": 0.0, "tool_calls": 0},
                    {"turns": [{"tokens": 2, "cut": False}], "ended": "done", "return": 1.0, "tool_calls": 0},
                    {"turns": [{"tokens": 2, "cut": False}], "ended": "done", "return": 1.0, "tool_calls": 0}]
        return batch | Batch(columns={col.EPISODE: episodes})


def test_an_episode_is_cut_off_when_a_turn_was_or_it_ran_out_of_room():
    evaluator = Evaluator.__new__(Evaluator)
    evaluator.tokenizer, evaluator.eos = _Chars(), [ord("!")]
    rows = [{"answer": "4", col.PROMPT: "a"}, {"answer": "6", col.PROMPT: "b"}, {"answer": "8", col.PROMPT: "c"}]
    evaluator.sets = [HeldOut("eval/t/", rows, [("greedy", {"n": 1, "temperature": 0.0, "max_response_length": 9})],
                              "last_number")]
    values = evaluator.outcomes(_ToolActor(["4!", "6!", "8!"]), reward=None, step=0)["eval/t/"]
    assert values["cutoff_share"].tolist() == [1.0, 1.0, 0.0] and values["accuracy"].tolist() == [1.0, 1.0, 1.0]
    assert values["tool_call_share"].tolist() == [pytest.approx(1 / 3)]  # the padding row's episode left out


def test_wilson_interval_by_hand():
    # 5 of 10: centre 0.5, half-width z sqrt(0.025 + z^2/400) / (1 + z^2/10)
    z = 1.959963984540054
    half = z * math.sqrt(0.25 / 10 + z * z / 400) / (1 + z * z / 10)
    assert wilson(0.5, 10) == pytest.approx((0.5 - half, 0.5 + half))
    assert wilson(0.5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = wilson(0.0, 20)
    assert low == 0.0 and high == pytest.approx(z * z / (20 + z * z))  # 0 of n: [0, z^2 / (n + z^2)]


def test_paired_bootstrap_difference():
    a = torch.tensor([1.0, 1, 1, 0, 1, 0, 1, 1])
    assert paired_difference(a, a) == (0.0, 0.0, 0.0)
    shifted = paired_difference(a, a - 0.25)
    assert shifted == pytest.approx((0.25, 0.25, 0.25))  # a constant gain has no spread
    diff, low, high = paired_difference(a, torch.zeros(8))
    assert diff == 0.75 and low < diff < high <= 1.0 and paired_difference(a, torch.zeros(8)) == (diff, low, high)
    # pairing: a gain shared by hard and easy prompts alike is certain, though the values vary
    base = torch.linspace(0, 0.8, 40)
    assert paired_difference(base + 0.1, base)[1] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="one value per prompt"):
        paired_difference(a, a[:4])
    assert interval(torch.tensor([1.0, 0.0, 1.0, 1.0])) == wilson(0.75, 4)  # shares: Wilson
    low, high = interval(torch.tensor([3.0, 5.0, 4.0, 4.0]))  # lengths: the bootstrap's
    assert 3.0 <= low <= 4.0 <= high <= 5.0


def test_a_sets_file_beside_the_recipe_is_found_and_kept_absolute(tmp_path, monkeypatch):
    from hflow.trainer.config.load import absolute_paths, load_recipe

    project = tmp_path / "proj"
    project.mkdir()
    _write(project / "mine.jsonl", [{"prompt": "2+2", "answer": "4"}])
    (project / "my.yaml").write_text(json.dumps({
        "model": {"path": "models/tiny", "init": "tiny"}, "data": {"train": "synthetic:digits"},
        "eval": {"sets": [{"name": "mine", "data": "mine.jsonl"}, {"name": "s", "data": "synthetic:letter"}]}}))
    monkeypatch.chdir(tmp_path)  # another folder: proj/mine.jsonl is found beside the recipe
    loaded, _ = load_recipe(str(project / "my.yaml"), [])
    assert [s.data for s in loaded.eval.sets] == [str(project / "mine.jsonl"), "synthetic:letter"]
    (tmp_path / "here.jsonl").write_text("")
    loaded.eval.sets[0].data = "here.jsonl"  # what exists in the current folder: absolute for the run directory
    assert absolute_paths(loaded).eval.sets[0].data == str(tmp_path / "here.jsonl")


def test_eval_batch_size_reaches_every_pass_and_the_generator_s_sampling(tiny_model):
    """eval.batch_size rides in each pass's sampling (data.eval's, a set's greedy and sampled ones)
    and becomes the generation call's SamplingParams.batch_size; unset, None (the generator's own
    rollout.batch_size), and a training rollout never has one."""
    from hflow.engine.models.loading import load_tokenizer
    from hflow.engine.rollout.rollout_batch import sampling_for
    from hflow.trainer.config.load import build_recipe
    from hflow.trainer.placement.worker_specs import actor_spec

    tokenizer = load_tokenizer(str(tiny_model))
    sets = [{"name": "s", "data": "synthetic:letter", "k": 2}]
    for batch in (48, None):
        recipe = build_recipe({"model": {"path": str(tiny_model)},
                               "data": {"train": "synthetic:digits", "eval": "synthetic:digits"},
                               "eval": {"sets": sets, **({"batch_size": batch} if batch else {})}}, {}, "r.yaml")
        samplings = [sampling for held_out in Evaluator(recipe, tokenizer).sets for _, sampling in held_out.passes]
        assert [s["batch_size"] for s in samplings] == [batch] * 3
        rollout = actor_spec(recipe).rollout
        for sampling in samplings:
            params, _, _ = sampling_for(Batch(columns={}, meta={"step": 0, "eval": sampling}), rollout, 0, 0,
                                        torch.device("cpu"))
            assert params.batch_size == batch
    params, _, _ = sampling_for(Batch(columns={}, meta={"step": 1}), rollout, 0, 0, torch.device("cpu"))
    assert params.batch_size is None
