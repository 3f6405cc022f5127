"""Evaluation during training and `hflow eval`, through the real CLI on the tiny quickstart model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import RUN_VARYING, assert_one_line_error, crashed, read_events, run_hflow

QUICK = ["--set", "trainer.total_steps=4", "--set", "trainer.save_every=2", "--set", "logging.progress=lines"]
# A further held-out set: the letter task's rows in a template of the set's own, scored by extraction
# (right: a response whose first character is the row's letter), greedy and 3 sampled per prompt.
SET = {"name": "first", "data": "synthetic:letter", "size": 6, "template": "say {answer}: ", "chat": False,
       "max_response_length": 6, "extract": r"regex:^\s*(\S)", "k": 3}
EVAL = ["--set", "data.eval=synthetic:digits", "--set", "data.eval_size=8", "--set", "trainer.eval_every=3",
        # sampled, several per prompt: evaluation must not touch the rollout's random stream either
        "--set", "eval.n=2", "--set", "eval.temperature=1.0", "--set", f"eval.sets=[{json.dumps(SET)}]"]
EVAL_KEYS = {"eval/reward", "eval/accuracy", "eval/pass@2", "eval/response_length", "eval/cutoff_share", "timing/eval",
             *(f"eval/first/{k}" for k in ("accuracy", "response_length", "cutoff_share", "mean@3", "pass@3"))}
# What changes between identical runs (helpers.RUN_VARYING), and the evaluation's own keys.
NOT_TRAINING = (*RUN_VARYING, "eval/")


def _train(tmp_path: Path, tiny_model: Path, name: str, *extra: str) -> Path:
    out = tmp_path / name
    result = run_hflow("train", "grpo/quickstart", "--set", f"model.path={tiny_model}", "--output-dir", str(out),
                       *QUICK, *extra, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.stdout.strip().splitlines()[-1])


def _training(events: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if not k.startswith(NOT_TRAINING)} for e in events if e["step"] > 0]


@pytest.mark.slow
def test_eval_at_step_0_every_k_and_last_and_training_unchanged(tmp_path, tiny_model):
    with_eval = read_events(_train(tmp_path, tiny_model, "on", *EVAL))
    without = read_events(_train(tmp_path, tiny_model, "off"))
    assert [e["step"] for e in with_eval] == [0, 1, 2, 3, 4]
    assert set(with_eval[0]) == {"step", "time"} | EVAL_KEYS  # the baseline, before any update
    assert [e["step"] for e in with_eval if "eval/accuracy" in e] == [0, 3, 4]  # every 3 steps and the last
    for e in with_eval:
        if "eval/accuracy" in e:
            assert 0 <= e["eval/accuracy"] <= e["eval/pass@2"] <= 1
            assert 0 < e["eval/response_length"] <= 12
            assert 0 <= e["eval/first/accuracy"] <= 1 and 0 <= e["eval/first/mean@3"] <= e["eval/first/pass@3"] <= 1
            assert 0 < e["eval/first/response_length"] <= 6 and 0 <= e["eval/first/cutoff_share"] <= 1
    assert not any(k.startswith("eval/") for e in without for k in e)
    assert _training(with_eval) == _training(without)  # same seed: the same training, to the bit


@pytest.mark.slow
def test_resume_with_eval_is_exact(tmp_path, tiny_model):
    run = _train(tmp_path, tiny_model, "run", *EVAL)
    whole = read_events(run)
    shutil.rmtree(run / "checkpoints" / "step_000004")  # crashed after step 3, last checkpoint: step 2
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in whole if e["step"] <= 3))
    crashed(run, 3)
    resumed = run_hflow("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = read_events(run)
    assert [e["step"] for e in again] == [0, 1, 2, 3, 4]  # step 0 is not evaluated again
    for want, got in zip(whole, again):  # every key but the run-varying ones, reported by key if one differs
        want, got = ({k: v for k, v in e.items() if not k.startswith(RUN_VARYING)} for e in (want, got))
        assert got == want, (want["step"], {k: (want.get(k), got.get(k)) for k in want.keys() | got.keys()
                                            if want.get(k) != got.get(k)})


@pytest.mark.slow
def test_hflow_eval_scores_a_checkpoint_and_the_final_model(tmp_path, tiny_model, capsys):
    # Sampled (temperature 1, n=2), so the scores are not all 1.0: the eval seed stream is the step's.
    sampled = [*EVAL, "--set", "trainer.eval_every=2"]
    run = _train(tmp_path, tiny_model, "run", *sampled)
    logged = {e["step"]: e for e in read_events(run)}
    recipe = str(run / "recipe.yaml")
    checkpoints = run / "checkpoints"
    # A run's checkpoint, and the run folder, which stands for its final model (a model directory).
    for directory, step in ((checkpoints / "step_000002", 2), (run, 4)):
        result = run_hflow("eval", recipe, "--checkpoint", str(directory), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        printed = _printed(result.stdout)
        assert set(printed) == EVAL_KEYS - {"timing/eval"}
        # The policy of step k scored alone gives what training logged at step k.
        for key in printed:
            assert float(printed[key]) == pytest.approx(logged[step][key], abs=1e-4), (directory, key)
    assert logged[2]["eval/reward"] != logged[4]["eval/reward"]  # the comparison can tell policies apart
    _check_what_each_directory_stands_for(run, capsys)
    # no checkpoint: the base model, with the seeds of training's step-0 evaluation
    result = run_hflow("eval", recipe, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for key, value in _printed(result.stdout).items():
        assert value == pytest.approx(logged[0][key], abs=1e-4), key
    _compare_final_with_base(tmp_path, recipe, checkpoints / "step_000004", logged)


@pytest.mark.parametrize("zero", [0, 2])
def test_hflow_eval_of_a_bfloat16_checkpoint_reproduces_training_s_scores(tmp_path, tiny_model, zero):
    # bfloat16 weights with float32 masters (DeepSpeed's wrappers): `hflow eval` builds no training engine
    # and reads the masters alone, rounded to bfloat16 as training rounds them for its own evaluation.
    bf16 = ["--set", "model.dtype=bfloat16", "--set", f"actor.zero_stage={zero}", "--set", "trainer.eval_every=2",
            "--set", "trainer.total_steps=2"]
    run = _train(tmp_path, tiny_model, "run", *EVAL, *bf16)
    logged = {e["step"]: e for e in read_events(run)}
    # With the base model beside it on the same seeds: the checkpoint's own weights were read.
    result = run_hflow("eval", str(run / "recipe.yaml"), "--checkpoint", str(run / "checkpoints" / "step_000002"),
                       "--compare", "base", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:3] for line in result.stdout.splitlines() if line.startswith("eval/")}
    assert set(rows) == EVAL_KEYS - {"timing/eval"}
    for key, (a, _) in rows.items():
        assert float(a) == pytest.approx(logged[2][key], abs=1e-4), key
    assert any(float(a) != pytest.approx(float(b), abs=1e-4) for a, b in rows.values())


def _check_what_each_directory_stands_for(run: Path, capsys) -> None:
    """What `--checkpoint DIR` scores (`checkpoint_source`: a checkpoint's actor weights with its own
    step's seeds, or a model directory as model.path with the last step's), for the directories the
    command ran on above and the rest: a checkpoint, the final model, the run folder with and without
    final/ (a run stopped early stands for its newest whole checkpoint)."""
    from hflow.trainer.api.checkpoint import checkpoint_source
    from hflow.trainer.config.load import load_recipe

    step_4, final = run / "checkpoints" / "step_000004", run / "final"
    for directory, want in ((step_4, (str(step_4), 4)), (final, (None, 4)), (run, (None, 4))):
        recipe, _ = load_recipe(str(run / "recipe.yaml"), [])
        own_model = recipe.model.path
        assert checkpoint_source(directory, recipe) == want, directory
        assert recipe.model.path == (own_model if want[0] else str(final)), directory
    assert f"evaluating {final}" in capsys.readouterr().err
    final.rename(run.parent / "final-elsewhere")
    recipe, _ = load_recipe(str(run / "recipe.yaml"), [])
    assert checkpoint_source(run, recipe) == (str(step_4), 4)
    assert f"evaluating {step_4}" in capsys.readouterr().err


def _printed(stdout: str) -> dict[str, float]:
    """`hflow eval`'s lines "KEY VALUE 95% LOW-HIGH" as {KEY: VALUE}, each interval checked to hold its value."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("eval/"):
            key, value, *rest = line.split()
            if rest:
                low, high = map(float, rest[1].split("-"))
                assert rest[0] == "95%" and low <= float(value) <= high, line
            out[key] = float(value)
    return out


def _compare_final_with_base(tmp_path: Path, recipe: str, checkpoint: Path, logged: dict[int, dict]) -> None:
    """--compare prints A (the checkpoint, its step's seeds), B (the base model, on the same seeds: for a
    greedy set the step-0 values) and A - B inside its interval, per metric."""
    result = run_hflow("eval", recipe, "--checkpoint", str(checkpoint), "--compare", "base", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.startswith("eval/")}
    assert set(rows) == EVAL_KEYS - {"timing/eval"}
    for key, (a, b, diff, low, high) in rows.items():
        assert float(a) == pytest.approx(logged[4][key], abs=1e-4), key
        assert float(diff) == pytest.approx(float(a) - float(b), abs=2e-4), key
        assert float(low.strip("[,")) <= float(diff) <= float(high.strip("]")), key
    for key in ("eval/first/accuracy", "eval/first/response_length"):  # greedy: the seeds do not matter
        assert float(rows[key][1]) == pytest.approx(logged[0][key], abs=1e-4), key
    assert result.stdout.strip().splitlines()[-1].startswith(f"A: {checkpoint}; B: base; the same 6, 8 prompts")


def test_eval_bad_input_is_one_line(tmp_path, tiny_model):
    bad_dir = tmp_path / "empty"
    bad_dir.mkdir()
    result = run_hflow("eval", "grpo/quickstart", "--checkpoint", str(bad_dir),
                       "--set", "data.eval=synthetic:digits", "--set", f"model.path={tiny_model}", cwd=tmp_path)
    assert_one_line_error(result, "--checkpoint", "not a checkpoint")
    result = run_hflow("eval", "grpo/quickstart", "--checkpoint", str(bad_dir), cwd=tmp_path)
    assert_one_line_error(result, "data.eval is not set")
    for held_out, words in (({"name": "accuracy", "data": "x.jsonl"}, ("eval.sets", "'accuracy'", "own metrics")),
                            ({"name": "s", "data": "x.jsonl", "extract": "regex:("}, ("eval.sets", "does not compile")),
                            ({"name": "s", "data": "missing.jsonl"}, ("eval.sets 's' data", "does not exist")),
                            ({"name": "s", "data": "synthetic:letter", "template": "{answer.upper}"},
                             ("eval.sets 's' template", "not a plain {column}"))):
        result = run_hflow("validate", "grpo/quickstart", "--set", f"model.path={tiny_model}",
                           "--set", f"eval.sets=[{json.dumps(held_out)}]", cwd=tmp_path)
        assert_one_line_error(result, *words)


def test_train_refuses_an_eval_file_without_the_reward_columns(tmp_path, tiny_model):
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"prompt": "write digits: "}) + "\n")
    result = run_hflow("train", "grpo/quickstart", "--set", f"model.path={tiny_model}", "--set", f"data.eval={data}",
                       "--set", "trainer.eval_every=2", "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_one_line_error(result, "data.eval", "no column 'task', 'answer'")
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made
    result = run_hflow("validate", "grpo/quickstart", "--set", "trainer.eval_every=2", cwd=tmp_path)
    assert_one_line_error(result, "trainer.eval_every > 0 needs data.eval")
