"""A user's own reward function, as a new user writes it (issue #32, items 1, 3 and 5): a module
beside the recipe is found from any folder and in every worker, `validate` imports it and checks
it can be called with the data's columns, and a misspelt name stops `validate`, not the run."""

import json
import textwrap

from helpers import assert_one_line_error, run_hflow, write_recipe

REWARD = textwrap.dedent("""
    from helper_words import DIGITS  # a sibling module: the file's folder is on the import path

    def score(prompts, responses, **columns):
        return [float(sum(c in DIGITS for c in r[:8]) / 8) for r in responses]

    def strict(prompts, responses):
        return [0.0 for _ in responses]
""")


def _project(tmp_path, tiny_model, function):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "my_reward.py").write_text(REWARD)
    (project / "helper_words.py").write_text("DIGITS = set('0123456789')\n")
    return write_recipe(project / "my.yaml", tiny_model, reward={"function": function},
                        trainer={"total_steps": 2, "save_every": 0})


def test_a_reward_module_beside_the_recipe_is_found_from_another_folder(tmp_path, tiny_model):
    recipe = _project(tmp_path, tiny_model, "my_reward:score")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_hflow("validate", str(recipe), cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    result = run_hflow("train", str(recipe), cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-2000:]
    run = tmp_path / "proj" / "runs"
    (run_dir,) = list(run.iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2]
    assert all(0.0 <= e["reward/mean"] <= 1.0 for e in events)
    # the run keeps the file's absolute path: a resume from any folder imports the same code
    assert f"{tmp_path / 'proj' / 'my_reward.py'}:score" in (run_dir / "recipe.yaml").read_text()


def test_a_reward_file_named_by_its_path(tmp_path, tiny_model):
    recipe = _project(tmp_path, tiny_model, "my_reward.py:score")
    result = run_hflow("validate", str(recipe), cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_validate_stops_a_misspelt_module_or_function(tmp_path, tiny_model):
    recipe = _project(tmp_path, tiny_model, "my_rewrd:score")
    assert_one_line_error(run_hflow("validate", str(recipe), cwd=tmp_path), "reward.function", "my_rewrd",
                          "cannot import module", "beside the recipe")
    recipe.write_text(recipe.read_text().replace("my_rewrd:score", "my_reward:scor"))
    assert_one_line_error(run_hflow("validate", str(recipe), cwd=tmp_path), "reward.function", "no function 'scor'")


def test_validate_stops_a_function_that_cannot_take_the_data_columns(tmp_path, tiny_model):
    """The synthetic rows carry `task` and `answer`: a function without **kwargs fails at once."""
    recipe = _project(tmp_path, tiny_model, "my_reward:strict")
    assert_one_line_error(run_hflow("validate", str(recipe), cwd=tmp_path), "reward.function", "my_reward.py:strict",
                          "answer, task", "**kwargs")


def test_the_recipes_own_files_are_found_beside_it(tmp_path, tiny_model):
    """`data.train: train.jsonl` next to proj/my.yaml is read from any folder (issue #32, item 7);
    a file found nowhere is named with the absolute path looked for."""
    recipe = _project(tmp_path, tiny_model, "my_reward:score")
    (tmp_path / "proj" / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": "make digits: ", "answer": ""}) + "\n" for _ in range(16)))
    recipe.write_text(recipe.read_text().replace("train: synthetic:digits", "train: train.jsonl"))
    assert "train: train.jsonl" in recipe.read_text()
    result = run_hflow("validate", str(recipe), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    recipe.write_text(recipe.read_text().replace("train: train.jsonl", "train: missing.jsonl"))
    assert_one_line_error(run_hflow("validate", str(recipe), cwd=tmp_path), "data.train", "'missing.jsonl'",
                          f"looked for {tmp_path / 'missing.jsonl'}")
