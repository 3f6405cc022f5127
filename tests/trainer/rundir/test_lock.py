"""The run lock: one live process writes a run; a second one stops before writing anything,
naming the holder; readers (`hflow monitor`, `hflow runs`) do not need it."""

from __future__ import annotations

import logging
import os
import socket

import pytest

from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe
from hflow.trainer.rundir.read import read_status
from hflow.trainer.rundir.writer import RunDir


@pytest.fixture
def recipe(tmp_path):
    return build_recipe({"name": "locked", "algorithm": "grpo", "model": {"path": str(tmp_path / "model")},
                         "data": {"train": "synthetic:digits"}}, {}, "test")


def test_a_second_writer_is_refused_until_the_first_closes(recipe, tmp_path):
    first = RunDir.create(recipe, str(tmp_path / "runs"))
    first.write_status("running", 3)
    handlers = list(logging.getLogger("hflow").handlers)
    log_size = (first.path / "train.log").stat().st_size
    try:
        with pytest.raises(UserError) as refused:
            RunDir.reopen(first.path, recipe)
        line = str(refused.value)
        assert "\n" not in line
        for needle in (f"--resume {first.path}", "still running", f"pid {os.getpid()} on {socket.gethostname()}",
                       "run.lock", "kill -TERM"):
            assert needle in line, line
        # The refused one wrote nothing and attached no log handler.
        assert logging.getLogger("hflow").handlers == handlers
        assert (first.path / "train.log").stat().st_size == log_size
        # Readers do not take the lock: the run reads as running while it is held.
        assert read_status(first.path).status == "running"
    finally:
        first.close()
    second = RunDir.reopen(first.path, recipe)  # the lock went with close()
    second.close()


def closed_run(recipe, tmp_path) -> RunDir:
    run = RunDir.create(recipe, str(tmp_path / "runs"))
    run.write_status("failed", 3, "interrupted")
    run.close()
    return run


def test_a_run_lock_that_is_a_folder_is_one_line(recipe, tmp_path):
    run = closed_run(recipe, tmp_path)
    (run.path / "run.lock").unlink()
    (run.path / "run.lock").mkdir()
    with pytest.raises(UserError) as refused:
        RunDir.reopen(run.path, recipe)
    assert str(refused.value) == (f"{run.path / 'run.lock'} is a folder, not the run's lock file; remove it (hflow "
                                  "holds a lock on that file while a process writes the run)")


@pytest.mark.parametrize("name", ["run.lock", "train.log", "status.json.tmp", "events.jsonl.tmp"])
def test_a_file_of_the_run_that_is_a_link_is_refused_and_its_target_kept(recipe, tmp_path, name):
    """A run directory from someone else may point its files at yours: a resume writes nothing through them."""
    run = closed_run(recipe, tmp_path)
    victim = tmp_path / "precious.txt"
    victim.write_text("mine")
    (run.path / name).unlink(missing_ok=True)
    (run.path / name).symlink_to(victim)
    with pytest.raises(UserError) as refused:
        RunDir.reopen(run.path, recipe)
    assert str(refused.value).startswith(f"{run.path / name} is a symbolic link; hflow does not write through links")
    assert "\n" not in str(refused.value)
    assert victim.read_text() == "mine"


@pytest.mark.parametrize("write", [
    lambda run: run.write_status("running", 4),
    lambda run: run.write_plan({"backend": "local"}),
    lambda run: run.truncate_events(2),
])
def test_a_link_that_appears_during_the_run_is_not_written_through(recipe, tmp_path, write):
    run = RunDir.create(recipe, str(tmp_path / "runs"))
    victim = tmp_path / "precious.txt"
    victim.write_text("mine")
    for name in ("status.json.tmp", "plan.json.tmp", "events.jsonl.tmp"):
        (run.path / name).symlink_to(victim)
    try:
        with pytest.raises(UserError, match="is a symbolic link"):
            write(run)
    finally:
        run.close()
    assert victim.read_text() == "mine"


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "..", "a/b", "x\x1b[2J"])
def test_a_run_name_is_one_folder_name(name):
    """`../../x` or an absolute name would put the run directory outside trainer.output_dir."""
    with pytest.raises(UserError) as refused:
        build_recipe({"name": name, "model": {"path": "m"}, "data": {"train": "synthetic:digits"}}, {}, "r.yaml")
    line = str(refused.value)
    assert line.startswith(f"r.yaml: key 'name' has bad value {name!r}: "), line
    assert "one folder name" in line or "control characters" in line, line
