"""Broken model folders and prompt files stop `hflow validate` / `hflow train` before any
worker starts: one line naming the recipe key, the file and the problem, exit 2 (issue #14,
items 7 and 8). Each test is validation only: no training."""

import json
import shutil

import pytest

from helpers import assert_one_line_error, run_hflow, write_recipe


@pytest.fixture
def model(tmp_path, tiny_model):
    """A copy of the tiny model to break."""
    return shutil.copytree(tiny_model, tmp_path / "model")


def _validate(tmp_path, model, **sections):
    return run_hflow("validate", str(write_recipe(tmp_path / "r.yaml", model, **sections)))


@pytest.mark.parametrize("text, needle", [("{broken", "config.json that is not valid JSON"),
                                          ("", "empty config.json")])
def test_a_broken_config_json(tmp_path, model, text, needle):
    (model / "config.json").write_text(text)
    assert_one_line_error(_validate(tmp_path, model), "model.path", str(model), needle, "model_type")


def test_an_empty_model_folder_is_named_not_sentencepiece(tmp_path, tiny_model):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_hflow("train", str(write_recipe(tmp_path / "r.yaml", empty)))
    assert_one_line_error(result, "model.path", str(empty), "is empty", "config.json")
    assert "sentencepiece" not in result.stderr
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_a_truncated_safetensors_file_names_the_role_key(tmp_path, model, tiny_model):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    # The critic starts from critic.path: the message names that key, not the actor's.
    result = _validate(tmp_path, tiny_model, algorithm="ppo", critic={"path": str(model)})
    assert_one_line_error(result, "critic.path", str(model), "model.safetensors cut short")


def _jsonl(tmp_path, rows, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize("rows, needles", [
    ([{"prompt": "a"}] * 7 + [{"question": "b"}], ["row 8", "no column 'prompt'"]),
    ([{"prompt": "a"}, {"prompt": None}], ["row 2", "'prompt' that is null"]),
    ([{"prompt": [{"role": "user"}]}], ["row 1", "message 1 has no 'content'"]),
])
def test_a_bad_row_anywhere_in_the_file(tmp_path, tiny_model, rows, needles):
    data = _jsonl(tmp_path, rows)
    result = _validate(tmp_path, tiny_model, data={"train": data}, reward={"function": "length"})
    assert_one_line_error(result, "data.train", data, *needles)


def test_the_synthetic_reward_needs_a_task_column(tmp_path, tiny_model):
    data = _jsonl(tmp_path, [{"prompt": "a", "answer": "1"}])
    result = run_hflow("train", str(write_recipe(tmp_path / "r.yaml", tiny_model, data={"train": data})))
    assert_one_line_error(result, "data.train", "row 1 has no column 'task'", "reward.function 'synthetic'")
    assert not (tmp_path / "runs").exists()


def test_a_file_named_parquet_that_is_not_parquet(tmp_path, tiny_model):
    fake = tmp_path / "eval.parquet"
    fake.write_text('{"prompt": "a"}\n')
    result = _validate(tmp_path, tiny_model, data={"eval": str(fake)})
    assert_one_line_error(result, "data.eval", str(fake), "not a readable parquet file")


def test_no_inputs_checks_the_recipe_alone(tmp_path, tiny_model):
    path = write_recipe(tmp_path / "r.yaml", tiny_model, data={"train": str(tmp_path / "later.jsonl")})
    result = run_hflow("validate", "--no-inputs", str(path))
    assert result.returncode == 0 and result.stdout.startswith("ok: "), result.stderr


def test_a_reward_model_not_built_yet_is_named_before_any_download(tmp_path, tiny_model):
    """`models/tiny-reward-digits` before `hflow init-model` made it: `models/` is a folder here,
    so the path is local, not a hub id to retry against an unreachable hub."""
    (tmp_path / "models").mkdir()
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, reward={"model": "models/tiny-reward-digits"})
    result = run_hflow("validate", str(recipe), cwd=tmp_path)
    assert_one_line_error(result, "reward.model", "models/tiny-reward-digits", "does not exist", "init-model")


def test_a_hub_id_that_cannot_be_had_stops_at_once(tmp_path):
    """A hub id neither cached nor reachable (offline here) is one line before anything starts,
    not a minute of retries and a traceback; `train` leaves no run folder behind."""
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-cache")}
    hub = ["--set", "model.path=HuggingFaceTB/SmolLM2-135M-Instruct", "--set", "model.init=null"]
    result = run_hflow("validate", "grpo/quickstart", *hub, cwd=tmp_path, env=offline)
    assert_one_line_error(result, "model.path", "HuggingFaceTB/SmolLM2-135M-Instruct", "not in the local Hugging Face "
                          "cache", "HF_HUB_OFFLINE", "hflow init-model")
    result = run_hflow("train", "grpo/quickstart", *hub, "--output-dir", str(tmp_path / "runs"), cwd=tmp_path,
                       env=offline)
    assert_one_line_error(result, "model.path", "not in the local Hugging Face cache")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
