"""The CLI answers what needs no model without loading torch: a mistake in a recipe is one line
in a fraction of a second (torch alone takes 1.5-2 s to import on the 2-core machine), and
`--help` and `hflow recipes list` are as quick."""

import subprocess
import sys

import pytest

REPORT = ("import sys, atexit\n"
          "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stderr))\n"
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
