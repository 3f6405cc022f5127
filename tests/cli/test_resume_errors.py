"""--resume takes the run's recipe from its directory: nothing else may change its math."""

from __future__ import annotations

from helpers import assert_one_line_error, read_events, run_hflow, write_recipe


def _run_dir(tmp_path, tiny_model):
    run = tmp_path / "runs" / "test-1"
    run.mkdir(parents=True)
    write_recipe(run / "recipe.yaml", tiny_model)
    return run


def test_environment_overrides_of_the_math_are_refused_on_resume(tmp_path, tiny_model):
    run = _run_dir(tmp_path, tiny_model)
    result = run_hflow("train", "--resume", str(run), env={"HFLOW_ROLLOUT__TEMPERATURE": "2.0"})
    assert_one_line_error(result, "HFLOW_ROLLOUT__TEMPERATURE", "rollout.temperature", "--resume", "trainer.total_steps")


def test_hflow_variables_that_are_not_recipe_keys_are_left_alone_on_resume(tmp_path, tiny_model):
    """HFLOW_CPU_PRODUCTS chooses the CPU's product kernels, not a recipe key: a resume under it goes on."""
    run = _run_dir(tmp_path, tiny_model)
    result = run_hflow("train", "--resume", str(run), "--set", "trainer.total_steps=3",
                       env={"HFLOW_CPU_PRODUCTS": "blas"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert [e["step"] for e in read_events(run)][-1] == 3


def test_a_recipe_next_to_resume_is_refused(tmp_path, tiny_model):
    run = _run_dir(tmp_path, tiny_model)
    result = run_hflow("train", "remax/tiny", "--resume", str(run))
    assert_one_line_error(result, "remax/tiny", str(run / "recipe.yaml"), "--set")
