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
