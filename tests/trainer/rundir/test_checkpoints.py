"""The run directory picks the newest checkpoint whose files verify, names each one it skips,
reads event files a crash cut short, and turns a failed checkpoint write into one line."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from safetensors.torch import save_file

from hflow.errors import MachineError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.rundir.checkpoints import verify
from hflow.trainer.rundir.writer import RunDir


@pytest.fixture
def run(tmp_path):
    recipe = Recipe(model={"path": "m"}, data={"train": "synthetic:digits"}, trainer={"keep_checkpoints": 3})
    (tmp_path / "checkpoints").mkdir()
    return RunDir(tmp_path, recipe)


def checkpoint(run: RunDir, step: int):
    """A checkpoint as the session writes one: the actor's files, then trainer_state.json and COMPLETE."""
    tmp = run.staging_checkpoint(step)
    (tmp / "actor").mkdir()
    save_file({"w": torch.arange(1000.0), "b": torch.ones(10)}, tmp / "actor" / "weights.safetensors")
    save_file({"exp_avg/w": torch.zeros(1000)}, tmp / "actor" / "optimizer.safetensors")
    (tmp / "actor" / "engine.json").write_text(json.dumps({"updates": step, "scheduler": {"last_epoch": step}}))
    return run.commit_checkpoint(tmp, step, {"step": step})


def cut(path, keep: float = 0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def test_a_whole_checkpoint_verifies_and_is_picked(run):
    checkpoint(run, 2)
    newest = checkpoint(run, 4)
    assert verify(newest) is None
    assert run.resume_checkpoint() == (newest, [])


@pytest.mark.parametrize("name, problem", [
    ("actor/weights.safetensors", "actor/weights.safetensors is truncated (2.1 kB of 4.2 kB)"),
    ("actor/optimizer.safetensors", "actor/optimizer.safetensors is truncated"),
    ("actor/engine.json", "actor/engine.json is truncated"),
    ("trainer_state.json", "trainer_state.json is truncated"),
])
def test_a_cut_file_skips_its_checkpoint_for_the_one_before(run, name, problem):
    older = checkpoint(run, 2)
    newest = checkpoint(run, 4)
    cut(newest / name)
    picked, skipped = run.resume_checkpoint()
    assert picked == older
    assert len(skipped) == 1 and skipped[0].startswith(f"checkpoint step_000004 skipped: {problem}")
    assert skipped[0].endswith("; resuming from step_000002")


@pytest.mark.parametrize("name, problem", [
    ("actor/weights.safetensors", "actor/weights.safetensors is truncated (2.1 kB of 4.2 kB)"),
    ("actor/engine.json", "actor/engine.json is not valid JSON"),
])
def test_without_the_size_list_the_files_own_formats_still_catch_a_cut(run, name, problem):
    newest = checkpoint(run, 4)
    (newest / "COMPLETE").write_text("4")  # as checkpoints were marked before COMPLETE listed sizes
    assert verify(newest) is None
    cut(newest / name)
    assert verify(newest).startswith(problem)


def test_a_damaged_safetensors_header_and_a_missing_file_are_named(run):
    newest = checkpoint(run, 4)
    weights = newest / "actor" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:12] = b"\x00\x01\x02\x03"  # same size, header no longer JSON
    weights.write_bytes(bytes(data))
    assert verify(newest).startswith("actor/weights.safetensors has an unreadable header")
    (newest / "actor" / "optimizer.safetensors").unlink()
    assert verify(newest) == "actor/optimizer.safetensors is missing"


def test_when_no_checkpoint_verifies_the_run_starts_over(run):
    written = [checkpoint(run, step) for step in (2, 4)]
    for path in written:
        cut(path / "trainer_state.json")
    picked, skipped = run.resume_checkpoint()
    assert picked is None
    assert [line.split(":")[0] for line in skipped] == ["checkpoint step_000004 skipped",
                                                        "checkpoint step_000002 skipped"]
    assert all(line.endswith("starting over from step 1") for line in skipped)


def test_a_line_cut_short_in_events_and_samples_is_dropped(run):
    (run.path / "events.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "reward/me')
    (run.path / "samples.jsonl").write_text('{"step": 1, "response": "a"}\n{"step": 3, "resp')
    assert [e["step"] for e in run.events()] == [1, 2]
    run.truncate_events(1)
    assert (run.path / "events.jsonl").read_text() == '{"step": 1}\n'
    assert (run.path / "samples.jsonl").read_text() == '{"step": 1, "response": "a"}\n'


def test_a_failed_checkpoint_write_is_one_line_and_leaves_the_earlier_ones(run):
    checkpoint(run, 2)
    with pytest.raises(MachineError) as failed:
        with run.writing_checkpoint(4):
            run.staging_checkpoint(4)
            raise OSError(errno.ENOSPC, "No space left on device")
    assert str(failed.value) == (f"cannot write checkpoint step_000004 in {run.path}: No space left on device; "
                                 "the last complete checkpoint is step_000002")
    assert failed.value.exit_code == 1
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step_000002"]  # no staging folder left
    assert run.resume_checkpoint() == (run.checkpoints / "step_000002", [])


def test_the_engine_reports_a_checkpoint_write_failure_as_an_oserror(tmp_path):
    from hflow.engine.training.tensor_file import TensorFileWriter, TensorSpec

    with pytest.raises(OSError) as failed:
        TensorFileWriter(tmp_path / "no-such-folder" / "weights.safetensors", [TensorSpec("w", (2,))])
    assert failed.value.errno == errno.ENOENT


def test_a_damaged_checkpoint_is_moved_aside_on_resume(run):
    older = checkpoint(run, 2)
    newest = checkpoint(run, 4)
    cut(newest / "actor" / "weights.safetensors")
    picked, skipped = run.resume_checkpoint()
    assert picked == older
    assert skipped == ["checkpoint step_000004 skipped: actor/weights.safetensors is truncated (2.1 kB of 4.2 kB) "
                       "(moved to checkpoints/damaged/step_000004 for inspection); resuming from step_000002"]
    assert run.complete_checkpoints() == [older]
    kept = run.checkpoints / "damaged" / "step_000004"
    assert verify(kept).startswith("actor/weights.safetensors is truncated")  # kept as it was, for inspection


def test_pruning_keeps_the_newest_checkpoints_that_verify(run, capsys):
    """A damaged newest checkpoint (step 4) left in place used to count as the newest kept one: with
    keep_checkpoints 1 each good checkpoint written after it was deleted at once."""
    checkpoint(run, 2)
    damaged = checkpoint(run, 4)
    cut(damaged / "trainer_state.json")
    run.recipe.trainer.keep_checkpoints = 1
    written = checkpoint(run, 3)  # a resume from step 2 writes step 3
    assert run.complete_checkpoints() == [written]
    assert run.resume_checkpoint() == (written, [])
    assert (run.checkpoints / "damaged" / "step_000004" / "trainer_state.json").is_file()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["checkpoint step_000004 does not verify: trainer_state.json is truncated (5 B of 11 B); moved "
                     "to checkpoints/damaged/step_000004 for inspection, not counted among the "
                     "trainer.keep_checkpoints=1 kept"]
    again = checkpoint(run, 4)  # a second damaged step 4 later keeps the first one's place
    cut(again / "trainer_state.json")
    checkpoint(run, 5)
    assert sorted(p.name for p in (run.checkpoints / "damaged").iterdir()) == ["step_000004", "step_000004-2"]


def test_each_checkpoint_records_the_recipe_hash(run):
    run.recipe_digest = "ab" * 32
    state = json.loads((checkpoint(run, 2) / "trainer_state.json").read_text())
    assert state == {"step": 2, "recipe_sha256": "ab" * 32}


def test_final_appears_whole_or_not_at_all(run):
    with pytest.raises(MachineError) as failed:
        with run.writing_final() as staging:
            (staging / "config.json").write_text("{}")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert str(failed.value) == (f"cannot write final in {run.path}: No space left on device; "
                                 "no checkpoint was written yet")
    assert sorted(p.name for p in run.path.iterdir()) == ["checkpoints"]  # no final/, no staging left
    with run.writing_final() as staging:
        (staging / "config.json").write_text('{"first": 1}')
        assert not (run.path / "final").exists()  # written beside, renamed into place when whole
    with run.writing_final() as staging:
        (staging / "config.json").write_text('{"second": 2}')
        assert (run.path / "final" / "config.json").read_text() == '{"first": 1}'  # the old one until then
    assert sorted(p.name for p in run.path.iterdir()) == ["checkpoints", "final"]
    assert (run.path / "final" / "config.json").read_text() == '{"second": 2}'
