"""The CLI answers what needs no model without loading torch: a mistake in a recipe, a missing
model folder or a broken data row is one line in about a second (torch alone takes 1.5-2 s to
import on the 2-core machine, transformers 1.6 s more, and `hflow train` loads deepspeed and the
algorithm's modules too: 7.2 s for a data row's error before the rows were checked first), and
`--help` and `hflow recipes list` are as quick."""

import subprocess
import sys

import pytest

REPORT = ("import sys, atexit\n"
          "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, 'transformers loaded:',\n"
          "                              'transformers' in sys.modules, file=sys.stderr))\n"
          "sys.argv = ['hflow', *sys.argv[1:]]\n"
          "from hflow.cli.app import main\n"
          "main()\n")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", REPORT, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["validate", "train", "eval", "bench step", "map"])
def test_a_recipe_mistake_is_answered_before_torch_loads(tmp_path, command):
    bad = tmp_path / "r.yaml"
    bad.write_text("algorithm: grpo\nmodel:\n  path: m\ndata:\n  train: synthetic:digits\nrollout:\n  n: 0\n")
    extra = ["--checkpoint", str(tmp_path)] if command == "eval" else []
    result = _run(*command.split(), str(bad), *extra)
    assert result.returncode == 2, result.stderr
    assert "rollout.n" in result.stderr and "torch loaded: False" in result.stderr, result.stderr


def test_help_and_the_recipe_list_do_not_load_torch():
    for args in (["--help"], ["recipes", "list"]):
        result = _run(*args)
        assert result.returncode == 0 and "torch loaded: False" in result.stderr, (args, result.stderr)


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_missing_model_folder_is_answered_before_torch_and_transformers_load(tmp_path, command):
    result = _run(command, "grpo/quickstart", "--set", f"model.path={tmp_path / 'no-such-model'}",
                  "--set", "model.init=null")
    assert result.returncode == 2, result.stderr
    assert f"model.path: model path '{tmp_path / 'no-such-model'}' does not exist" in result.stderr
    assert "torch loaded: False transformers loaded: False" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_broken_data_row_and_a_missing_reward_module_are_answered_before_torch_loads(tmp_path, tiny_model, command):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n{"prompt": "2 + 2 =", "answer": "4"}\n')
    bad.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n{"question": "2 + 2 ="}\n')
    where = ["--output-dir", str(tmp_path / "runs")] if command == "train" else []
    for data, words in ((good, "nonexistent_module_xyz"), (bad, f"data.train '{bad}': row 2 has no column 'prompt'")):
        result = _run(command, "grpo/quickstart", "--set", f"model.path={tiny_model}", "--set", f"data.train={data}",
                      "--set", "reward.function=nonexistent_module_xyz:score", *where)
        assert result.returncode == 2, result.stderr
        assert words in result.stderr, result.stderr
        assert "torch loaded: False transformers loaded: False" in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()  # nothing made for a run that cannot start


def test_eval_answers_a_wrong_checkpoint_model_folder_or_eval_row_before_torch_loads(tmp_path, tiny_model):
    rows = tmp_path / "eval.jsonl"
    rows.write_text('{"prompt": "write digits: "}\n')
    base = ["eval", "grpo/quickstart", "--set", f"model.path={tiny_model}"]
    not_a_checkpoint = [*base, "--set", "data.eval=synthetic:digits", "--checkpoint", str(tmp_path)]
    for args, words in ((not_a_checkpoint, "not a checkpoint"),
                        ([*base, "--set", f"data.eval={rows}"], f"data.eval '{rows}': row 1 has no column 'task'"),
                        (["eval", "grpo/quickstart", "--set", "data.eval=synthetic:digits", "--set", "model.init=null",
                          "--set", f"model.path={tmp_path / 'gone'}", "--compare", "base"], "does not exist")):
        result = _run(*args)
        assert result.returncode == 2, result.stderr
        assert words in result.stderr, result.stderr
        assert "torch loaded: False transformers loaded: False" in result.stderr, result.stderr
