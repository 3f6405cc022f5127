"""`hflow runs` and `hflow monitor` as typer commands: output, ordering, user errors."""

from __future__ import annotations

import json
import os
import socket

import pytest
import typer
from typer.testing import CliRunner

from hflow.cli.monitor import monitor, resolve_run_dir
from hflow.cli.monitor.app import MonitorApp
from hflow.cli.runs import runs

DEAD_PID = 2**22 + 12345  # above Linux pid_max: never alive


@pytest.fixture
def cli():
    """A typer app registering the commands the way cli/app.py does."""
    app = typer.Typer()
    app.command()(monitor)
    app.command()(runs)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_runs_table_sorted_by_start_with_statuses(tmp_path, cli, run_factory):
    run_factory(name="ppo-finished", status="finished", steps=10, total_steps=10, started=1_700_000_200.0)
    run_factory(name="grpo-failed", algorithm="grpo", status="failed", steps=3, started=1_700_000_100.0)
    run_factory(name="ppo-running", status="running", steps=4, pid=os.getpid(), started=1_700_000_300.0)
    run_factory(name="ppo-crashed", status="running", steps=2, pid=DEAD_PID, started=1_700_000_000.0)
    run_factory(name="remote", status="running", steps=1, pid=DEAD_PID, hostname=socket.gethostname() + "-node7",
                started=1_700_000_400.0)
    (tmp_path / "runs" / "scratch").mkdir()  # not a run: ignored

    result = cli("runs", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    rows = [ln for ln in result.stdout.splitlines() if ln.startswith("│")]
    names = [r.split("│")[1].strip() for r in rows]
    assert names == ["ppo-crashed", "grpo-failed", "ppo-finished", "ppo-running", "remote"]
    by_name = dict(zip(names, [[c.strip() for c in r.split("│")[1:-1]] for r in rows]))
    # columns: name, algorithm, model, steps, last reward, status, started, why
    assert by_name["ppo-finished"][1:6] == ["ppo", "tiny-llama", "10/10", "1", "finished"]
    assert by_name["grpo-failed"][1] == "grpo" and by_name["grpo-failed"][5] == "failed"
    assert by_name["ppo-running"][3:6] == ["4/10", "0.4", "running"]
    assert by_name["ppo-crashed"][5] == "failed (crashed)"
    assert by_name["remote"][5] == "running"  # pid of another host is not checked here
    assert by_name["ppo-finished"][6].startswith("2023-11-1")
    # a failed run says why (its status.json's error); the others leave the column empty
    assert by_name["grpo-failed"][7] == "RuntimeError: CUDA out of memory"
    assert by_name["ppo-finished"][7] == "" and by_name["ppo-running"][7] == ""


def test_piped_runs_keep_every_column_at_80_columns(tmp_path, run_factory):
    run_factory(name="grpo-quickstart-20261123-140000-with-a-long-name", algorithm="grpo", status="finished",
                steps=10, total_steps=10)
    app = typer.Typer()
    app.command()(runs)
    result = CliRunner().invoke(app, [str(tmp_path / "runs")], env={"COLUMNS": "80"})  # one command: no name
    assert result.exit_code == 0, result.output
    row = next(ln for ln in result.stdout.splitlines() if "with-a-long-name" in ln)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[:6] == ["grpo-quickstart-20261123-140000-with-a-long-name", "grpo", "tiny-llama", "10/10", "1",
                         "finished"]


def test_runs_prints_a_runs_markup_and_escape_codes_as_text(tmp_path, cli, run_factory):
    """status.json is any text its writer chose (a run directory may come from someone else): Rich
    markup is shown, not applied; terminal escapes and bidirectional overrides never reach the terminal."""
    run = run_factory(name="shared", status="finished", steps=10, total_steps=10)
    status = json.loads((run / "status.json").read_text())
    status.update(algorithm="[bold red]grpo[/]", model="\x1b]0;owned\x07tiny\x1b[2J\u202e", status="finished\x1b[8m")
    (run / "status.json").write_text(json.dumps(status))
    result = cli("runs", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    assert not any(ch in result.stdout for ch in "\x1b\x07\u202e")
    row = next(ln for ln in result.stdout.splitlines() if "shared" in ln)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1:3] == ["[bold red]grpo[/]", "]0;ownedtiny[2J"]
    assert cells[5] == "finished[8m"


def test_runs_on_run_without_events_shows_dash(tmp_path, cli, run_factory):
    run_factory(name="fresh", steps=0, pid=os.getpid())
    result = cli("runs", str(tmp_path / "runs"))
    assert result.exit_code == 0
    row = next(ln for ln in result.stdout.splitlines() if "fresh" in ln)
    assert "0/10" in row and "–" in row


def test_runs_missing_dir_is_one_line_exit_2(tmp_path, cli):
    result = cli("runs", str(tmp_path / "nope"))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and str(tmp_path / "nope") in result.stderr
    assert "Traceback" not in result.output


def test_runs_empty_dir_says_so(tmp_path, cli):
    (tmp_path / "runs").mkdir()
    result = cli("runs", str(tmp_path / "runs"))
    assert result.exit_code == 0 and "no runs found" in result.stderr


@pytest.mark.parametrize("case", ["missing", "not-a-run"])
def test_monitor_bad_run_dir_is_one_line_exit_2(tmp_path, cli, case):
    path = tmp_path / case
    if case == "not-a-run":
        path.mkdir()
    result = cli("monitor", str(path))
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "expected" in lines[0]
    assert "Traceback" not in result.output


def test_monitor_without_runs_is_one_line_exit_2(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("monitor")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "hflow monitor: no RUN_DIR given and runs: no such directory "
        "(expected a folder of runs written by `hflow train`)"]
    (tmp_path / "runs").mkdir()
    result = cli("monitor")
    assert result.exit_code == 2 and "runs: no runs found" in result.stderr


def test_monitor_defaults_to_newest_run_and_starts_app(tmp_path, cli, run_factory, monkeypatch):
    run_factory(name="old", started=100.0)
    newest = run_factory(name="new", started=300.0)
    run_factory(name="middle", started=200.0)
    monkeypatch.chdir(tmp_path)
    assert resolve_run_dir(None).resolve() == newest.resolve()

    started = []
    monkeypatch.setattr(MonitorApp, "run", lambda self: started.append((self.watcher.run_dir, self.interval)))
    result = cli("monitor", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    assert started == [(newest.relative_to(tmp_path), 0.5)]


def test_help_texts_come_from_docstrings(cli):
    out = cli("runs", "--help").stdout
    assert "List the runs under DIR" in out and "[DIR]" in out
    out = cli("monitor", "--help").stdout
    assert "Watch a training run" in out and "[RUN_DIR]" in out


def test_the_top_help_names_every_algorithm():
    from typer.testing import CliRunner

    from hflow.cli.app import app
    from hflow.trainer.config.algorithm_sections import ALGORITHMS

    out = " ".join(CliRunner().invoke(app, ["--help"]).stdout.split())  # wrapped to the terminal
    assert all(name in out for name in ALGORITHMS), out


def test_a_long_help_flows_at_any_width():
    """A docstring's hard-wrapped lines flow as one paragraph in a narrow terminal (issue #32,
    item 10): no line of `train --help` ends where the docstring's line ended."""
    from typer.testing import CliRunner

    from hflow.cli.app import app

    out = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "70"}).stdout
    lines = [line.strip() for line in out.splitlines()]
    assert not any(line.endswith("the workers shut down,") for line in lines), out
    assert "the workers shut down, and the exit code" in " ".join(lines)
