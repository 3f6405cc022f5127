"""Every `hflow ...` command in a fenced block of the docs (docs/**/*.md) and of the README is
checked against the real command-line app: it parses (a command, option or argument the app does
not have fails), and a recipe it names exists and loads with its `--set` overrides (an unknown key
fails). The read-only ones (`hflow recipes ...`, `hflow map ...`) also run. Commands that need a GPU
or a cluster are only parsed and loaded, never run.

Placeholders are allowed where the docs mean "yours": an argument in capitals (`RECIPE`,
`RUN_DIR`), one with `<...>` in it (`runs/<run>/final`), or a `my_*` file; such an argument is
parsed but not opened.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hflow.cli.app import app
from hflow.errors import UserError
from hflow.trainer.config.load import load_recipe

ROOT = Path(__file__).resolve().parents[2]
# reference/cli.md is the app's own help (its usage lines are syntax, not commands)
SOURCES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "cli.md")]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
RUNS = {"recipes", "map"}  # read-only and fast: run as well as parsed


def fenced_commands(text: str) -> list[str]:
    """The `hflow ...` command lines of the shell blocks in `text` (a `$ ` prompt dropped, lines
    continued with a backslash joined, comments kept for shlex to drop)."""
    commands = []
    for info, body in FENCE.findall(text):
        if info not in SHELL_FENCES:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("hflow "):
                commands.append(line)
    return commands


def is_placeholder(value: str) -> bool:
    name = Path(value).name
    return bool(re.fullmatch(r"[A-Z][A-Z_]*", value)) or "<" in value or name.startswith("my_")


def check_command(line: str) -> str | None:
    """What is wrong with one documented command line, or None."""
    args = shlex.split(line, comments=True)[1:]
    command = typer.main.get_command(app)
    ctx = typer.Context(command, info_name="hflow")
    path: list[str] = []
    while getattr(command, "commands", None):  # a group: `hflow`, `hflow recipes`
        if not args or args[0].startswith("-"):
            return f"no command after 'hflow {' '.join(path)}'"
        name = args.pop(0)
        sub = command.get_command(ctx, name)
        if sub is None:
            return f"no such command: hflow {' '.join([*path, name])}"
        path.append(name)
        command, ctx = sub, typer.Context(sub, info_name=name, parent=ctx)
    try:
        params = command.make_context(" ".join(path), args, parent=ctx.parent).params
    except typer.Exit:
        return None  # --help
    except typer.TyperException as err:  # typer's usage errors: no such option, missing argument, ...
        return f"hflow {' '.join(path)}: {err.format_message()}"
    recipe = params.get("recipe")
    if recipe and not is_placeholder(recipe):
        try:
            load_recipe(recipe, params.get("set_") or ())
        except UserError as err:
            return str(err)
    return None


def documented_commands() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), line) for path in SOURCES for line in fenced_commands(path.read_text())]


def test_the_docs_have_commands_to_check():
    found = documented_commands()
    assert len(found) > 50 and {source for source, _ in found} >= {"README.md", "docs/getting-started/index.md"}


@pytest.mark.parametrize("source, line", documented_commands())
def test_documented_command_parses_and_its_recipe_loads(source, line, monkeypatch):
    monkeypatch.chdir(ROOT)  # recipes/... paths are the repository's
    problem = check_command(line)
    assert problem is None, f"{source}: `{line}`: {problem}"


@pytest.mark.parametrize("source, line", [(s, c) for s, c in documented_commands() if c.split()[1] in RUNS])
def test_read_only_documented_command_runs(source, line, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    args = shlex.split(line, comments=True)[1:]
    if any(is_placeholder(a) for a in args[1:]):
        pytest.skip("names the reader's own recipe")
    if args[:2] == ["recipes", "cp"]:
        args[-1] = str(tmp_path / Path(args[-1]).name)  # a copy, not into the repository
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"{source}: `{line}`: {result.output[-2000:]}"


def test_collector_finds_commands_and_the_checker_refuses_bad_ones():
    text = "\n".join([
        "Prose with `hflow train nowhere` inline is not collected.",
        "```", "$ hflow recipes list   # a comment", "hflow train grpo/quickstart \\", "  --set trainer.total_steps=2",
        "ray start --head", "```",
        "```python", "hflow.train('grpo/quickstart')", "```",
        "```", "hflow trian grpo/quickstart", "hflow train grpo/quickstart --steps 3",
        "hflow train recipes/grpo/nowhere.yaml", "hflow train grpo/quickstart --set grpo.num_generations=4",
        "hflow map", "hflow train my_recipe.yaml --set trainer.total_steps=5", "```",
    ])
    commands = fenced_commands(text)
    assert commands[:2] == ["hflow recipes list   # a comment",
                            "hflow train grpo/quickstart    --set trainer.total_steps=2"]
    assert len(commands) == 8
    good, typo, option, missing, key, no_arg, placeholder = (commands[1], *commands[2:])
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        assert check_command(commands[0]) is None and check_command(good) is None
        assert "no such command" in check_command(typo)
        assert "--steps" in check_command(option)
        assert "nowhere" in check_command(missing)
        assert "hflow's key is 'rollout.n'" in check_command(key)
        assert "recipe" in check_command(no_arg).lower()
        assert check_command(placeholder) is None
