"""Faults around checkpoints: a damaged newest checkpoint, or an events line a crash cut short,
still resumes (from the checkpoint before it, re-doing the steps after it, metrics equal to the
uninterrupted run's); a full disk while checkpointing or between checkpoints, or a run directory
deleted mid-run, is one line, leaves the earlier checkpoints and marks the run failed where it can."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from helpers import crashed, read_events, run_hflow, write_recipe
from hflow.trainer.rundir.checkpoints import verify

COMPARED = ["reward/mean", "kl/mean", "entropy/mean", "response_length/mean", "actor/loss",
            "actor/grad_norm", "actor/lr"]


def recipe_for(tmp: Path, model: Path, total_steps: int) -> Path:
    return write_recipe(tmp / "r.yaml", model, grpo={"kl_coef": 0.01},
                        trainer={"total_steps": total_steps, "prompts_per_step": 8, "save_every": 2,
                                 "keep_checkpoints": 3, "output_dir": str(tmp / "runs")})


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model):
    """One uninterrupted 6-step run (checkpoints at steps 2, 4, 6), shared by copying its directory."""
    tmp = tmp_path_factory.mktemp("finished")
    full = run_hflow("train", str(recipe_for(tmp, tiny_model, 6)))
    assert full.returncode == 0, full.stderr[-3000:]
    run = Path(full.stdout.strip().splitlines()[-1])
    return run, read_events(run)


def copy_of(finished, tmp_path: Path) -> Path:
    run = tmp_path / finished[0].name
    shutil.copytree(finished[0], run)
    return run


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def assert_resumed_like_uninterrupted(run: Path, reference: list[dict], from_step: int) -> None:
    events = read_events(run)
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5, 6]  # each step exactly once
    for before, after in zip(reference[from_step:], events[from_step:]):
        for key in COMPARED:
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), (after["step"], key)
    assert json.loads((run / "status.json").read_text())["status"] == "finished"


@pytest.mark.slow
# A role's file and the controller's end to end; tests/trainer/rundir/test_checkpoints.py covers all four.
@pytest.mark.parametrize("damaged", ["actor/weights.safetensors", "trainer_state.json"])
def test_a_damaged_newest_checkpoint_resumes_from_the_one_before(finished, tmp_path, damaged):
    run = copy_of(finished, tmp_path)
    cut_in_half(run / "checkpoints" / "step_000006" / damaged)
    crashed(run, 6)  # the machine went down after step 6's checkpoint, before the export
    resumed = run_hflow("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    skipped = [line for line in resumed.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 1, resumed.stderr
    assert skipped[0].startswith(f"checkpoint step_000006 skipped: {damaged} is truncated (")
    assert skipped[0].endswith("; resuming from step_000004")
    assert "Traceback" not in resumed.stderr
    assert_resumed_like_uninterrupted(run, finished[1], from_step=4)  # steps 5 and 6 were re-done
    assert (run / "checkpoints" / "step_000006" / damaged).stat().st_size \
        == (finished[0] / "checkpoints" / "step_000006" / damaged).stat().st_size  # written whole again


@pytest.mark.slow
def test_an_events_line_cut_short_by_a_crash_is_dropped_on_resume(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    shutil.rmtree(run / "checkpoints" / "step_000006")  # the crash came while step 6's event was written
    lines = (run / "events.jsonl").read_text().splitlines()
    (run / "events.jsonl").write_text("\n".join(lines[:5]) + "\n" + lines[5][:40])
    samples = (run / "samples.jsonl").read_text()
    (run / "samples.jsonl").write_text(samples[:len(samples) - 30])
    crashed(run, 5)
    resumed = run_hflow("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed_like_uninterrupted(run, finished[1], from_step=4)
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert rows == [json.loads(line) for line in samples.splitlines()]  # the same samples, none torn


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_earlier_checkpoint(
        tmp_path, tiny_model, monkeypatch, capsys):
    from hflow.cli.app import main
    from hflow.engine.training.tensor_file import TensorFileWriter

    real_write = TensorFileWriter.write

    def full_disk_at_step_4(self, name, tensor):  # step 2's files are written; step 4's weights fail
        if "step_000004" in str(self.path):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real_write(self, name, tensor)

    monkeypatch.setattr(TensorFileWriter, "write", full_disk_at_step_4)
    monkeypatch.setattr(sys, "argv", ["hflow", "train", str(recipe_for(tmp_path, tiny_model, 4))])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 1
    err = capsys.readouterr().err
    (run,) = (tmp_path / "runs").iterdir()
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [(f"error: cannot write checkpoint step_000004 in {run}: No space left on device; "
                       "the last complete checkpoint is step_000002")]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and status["error"] == errors[0].removeprefix("error: ")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]  # no staging left
    assert verify(run / "checkpoints" / "step_000002") is None


def fill_the_disk(monkeypatch, full) -> None:
    """While `full()` is true, the run directory's files behave as on a full disk: a write that needs
    a new block fails with ENOSPC, one within the 4 KiB blocks a file holds already succeeds."""
    from hflow.trainer.rundir import files

    real_write_all = files.write_all

    def write_all(fd, data):
        if full():
            size = os.fstat(fd).st_size
            at = size if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND else os.lseek(fd, 0, os.SEEK_CUR)
            if at + len(data) > -(-size // 4096) * 4096:
                raise OSError(errno.ENOSPC, "No space left on device")
        real_write_all(fd, data)

    monkeypatch.setattr(files, "write_all", write_all)


def train_in_process(monkeypatch, *args) -> int:
    from hflow.cli.app import main

    monkeypatch.setattr(sys, "argv", ["hflow", "train", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return exited.value.code


@pytest.mark.slow
def test_a_disk_that_fills_between_checkpoints_is_one_line_and_the_run_resumes(
        tmp_path, tiny_model, monkeypatch, capsys):
    from hflow.trainer.rundir.writer import RunDir

    committed = []
    real_commit = RunDir.commit_checkpoint

    def commit(self, tmp, step, state):  # the disk fills up right after step 2's checkpoint
        final = real_commit(self, tmp, step, state)
        committed.append(step)
        return final

    monkeypatch.setattr(RunDir, "commit_checkpoint", commit)
    fill_the_disk(monkeypatch, lambda: bool(committed))
    assert train_in_process(monkeypatch, str(recipe_for(tmp_path, tiny_model, 4))) == 1
    err = capsys.readouterr().err
    (run,) = (tmp_path / "runs").iterdir()
    assert "Traceback" not in err and "Logging error" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cannot write status.json in {run}: No space left on device; "
                      "the last complete checkpoint is step_000002"]
    status = json.loads((run / "status.json").read_text())  # written in the blocks status.json had
    assert status["status"] == "failed" and status["error"] == errors[0].removeprefix("error: ")
    assert [e["step"] for e in read_events(run)] == [1, 2]
    assert verify(run / "checkpoints" / "step_000002") is None

    monkeypatch.undo()  # room again: the run goes on from its checkpoint
    resumed = run_hflow("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e["step"] for e in read_events(run)] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_run_directory_deleted_mid_run_is_one_line_and_stays_deleted(tmp_path, tiny_model, monkeypatch, capsys):
    from hflow.trainer.rundir.writer import RunDir

    real_append = RunDir.append_event
    deleted = []

    def append_event(self, event):
        if event["step"] == 2:
            shutil.rmtree(self.path)
            deleted.append(self.path)
        real_append(self, event)

    monkeypatch.setattr(RunDir, "append_event", append_event)
    assert train_in_process(monkeypatch, str(recipe_for(tmp_path, tiny_model, 4))) == 1
    err = capsys.readouterr().err
    (run,) = deleted
    assert "Traceback" not in err and "Logging error" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cannot write events.jsonl: the run directory {run} is gone (moved or deleted during "
                      "the run)"]
    assert not run.exists()  # nothing of it written again
