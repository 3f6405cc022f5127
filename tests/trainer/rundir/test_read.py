"""The run-directory reader shared by `hflow monitor` and `hflow runs`."""

from __future__ import annotations

import json
import math
import os
import socket

import pytest

from hflow.trainer.rundir.metrics import MetricTable, iter_memory_keys
from hflow.trainer.rundir.read import (
    RunDirError,
    check_run_dir,
    find_runs,
    newest_run,
    read_last_event,
    read_plan,
    read_status,
)
from hflow.trainer.rundir.tail import JsonlTail, LineTail
from hflow.trainer.rundir.watcher import RunWatcher


def test_line_tail_holds_partial_line_until_newline(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2')
    tail = LineTail(path)
    assert tail.poll() == [b'{"step": 1}']
    assert tail.offset == path.stat().st_size  # read to the end ...
    assert tail.partial == b'{"step": 2'  # ... but the torn line is held back
    assert tail.poll() == []
    with open(path, "ab") as f:
        f.write(b', "x": 1}\n')
    assert tail.poll() == [b'{"step": 2, "x": 1}']
    assert tail.partial == b""


def test_line_tail_reads_only_appended_bytes(tmp_path):
    path = tmp_path / "log"
    path.write_text("a\nb\n")
    tail = LineTail(path)
    tail.poll()
    assert tail.bytes_read == 4
    with open(path, "a") as f:
        f.write("ccc\n")
    assert tail.poll() == [b"ccc"]
    assert tail.bytes_read == 8 and tail.offset == 8


def test_line_tail_chunked_reads_and_missing_file(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = LineTail(path)
    assert tail.poll() == [] and not tail.pending()  # not created yet
    path.write_text("".join(f"line{i}\n" for i in range(10)))  # 6 bytes per line
    got = []
    while tail.pending():
        got += tail.poll(max_bytes=7)  # chunk boundaries fall mid-line
    assert got == [f"line{i}".encode() for i in range(10)]


def test_line_tail_restarts_when_file_shrinks(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("one\ntwo\n")
    tail = LineTail(path)
    tail.poll()
    path.write_text("new\n")
    assert tail.poll() == [b"new"]
    assert tail.resets == 1


def test_line_tail_start_near_end_skips_cut_line(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {i:04d}\n" for i in range(1000)))  # 10 bytes per line
    tail = LineTail(path, start_near_end=25)
    assert tail.poll() == [b"line 0998", b"line 0999"]


def test_jsonl_tail_skips_and_counts_bad_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"step": 1}\nnot json\n[1, 2]\n{"step": 2}\n')
    tail = JsonlTail(path)
    assert tail.poll_objects() == [{"step": 1}, {"step": 2}]
    assert tail.bad_lines == 2


def test_metric_table_aligns_columns_with_nan():
    t = MetricTable()
    t.add({"step": 1, "time": 10.0, "reward/mean": 0.5})
    t.add({"step": 2, "time": 11.0, "kl/mean": 0.1, "note": "hello"})
    t.add({"step": 3, "reward/mean": 0.7, "kl/mean": 0.2})
    assert list(t.steps) == [1, 2, 3]
    r = list(t.column("reward/mean"))
    k = list(t.column("kl/mean"))
    assert r[0] == 0.5 and math.isnan(r[1]) and r[2] == 0.7
    assert math.isnan(k[0]) and k[1:] == [0.1, 0.2]
    assert math.isnan(t.times[2])
    assert t.row(1) == {"kl/mean": 0.1}
    assert t.text == {"note": "hello"}
    assert t.stats("reward/mean") == (pytest.approx(0.6), 0.7)
    assert t.keys("kl/") == ["kl/mean"]


def test_metric_table_resume_drops_replaced_steps():
    t = MetricTable()
    for s in range(1, 6):
        t.add({"step": s, "reward/mean": float(s)})
    t.add({"step": 4, "reward/mean": 40.0})  # resumed from the step-3 checkpoint
    assert list(t.steps) == [1, 2, 3, 4]
    assert list(t.column("reward/mean")) == [1.0, 2.0, 3.0, 40.0]
    t.add({"reward/mean": 1.0})  # no step: not a training event
    assert t.skipped == 1 and len(t) == 4
    assert t.row_of_step(4) == 3 and t.row_of_step(100) == 3


def test_read_status_crash_rule(run_factory):
    alive = read_status(run_factory(name="alive", pid=os.getpid()))
    assert (alive.status, alive.crashed) == ("running", False)

    dead = read_status(run_factory(name="dead", pid=2**22 + 12345))  # above Linux pid_max
    assert (dead.status, dead.crashed) == ("failed", True)
    assert str(2**22 + 12345) in dead.error

    elsewhere = read_status(run_factory(name="other-host", pid=2**22 + 12345, hostname=socket.gethostname() + "-x"))
    assert elsewhere.status == "running"  # the pid belongs to another machine

    done = read_status(run_factory(name="done", status="finished", pid=2**22 + 12345))
    assert done.status == "finished" and not done.crashed


def test_read_status_falls_back_to_recipe(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "recipe.yaml").write_text("name: r1\nalgorithm: grpo\nmodel: {path: m}\ntrainer: {total_steps: 7}\n")
    st = read_status(run)
    assert (st.name, st.algorithm, st.model, st.total_steps, st.status) == ("r1", "grpo", "m", 7, "unknown")


def test_read_plan_maps_rank_to_device(run_factory):
    plan = read_plan(run_factory())
    assert plan.backend == "local"
    assert [p.name for p in plan.pools] == ["pool0", "pool1"]
    assert plan.device("actor", 1) == "cuda:1"
    assert plan.device("critic", 0) == "cuda:2"
    assert plan.device("critic", 5) is None and plan.device("nobody", 0) is None


def test_memory_keys_parse():
    keys = ["memory/peak_bytes", "memory/actor/rank1/peak_bytes", "memory/critic/rankX/peak_bytes"]
    assert list(iter_memory_keys(keys)) == [("actor", 1, "memory/actor/rank1/peak_bytes")]


def test_read_last_event_ignores_torn_line(run_factory):
    run = run_factory(steps=3)
    with open(run / "events.jsonl", "a") as f:
        f.write('{"step": 4, "reward/me')
    assert read_last_event(run)["step"] == 3


def test_find_runs_sorted_by_start_and_errors(tmp_path, run_factory):
    run_factory(name="b", started=200.0)
    run_factory(name="a", started=300.0)
    run_factory(name="c", started=100.0)
    (tmp_path / "runs" / "not-a-run").mkdir()
    assert [p.name for p in find_runs(tmp_path / "runs")] == ["c", "b", "a"]
    assert newest_run(tmp_path / "runs").name == "a"
    with pytest.raises(RunDirError, match="no such directory"):
        find_runs(tmp_path / "missing")
    with pytest.raises(RunDirError, match="not a run directory"):
        check_run_dir(tmp_path / "runs" / "not-a-run")


def test_watcher_samples_and_log(run_factory):
    run = run_factory(steps=3)
    w = RunWatcher(run)
    w.refresh()
    assert [s["prompt"] for s in w.samples_at(2)] == ["prompt 2.0", "prompt 2.1"]
    assert [s["step"] for s in w.samples_at(99)] == [3, 3]
    assert list(w.log_lines) == ["INFO step 1 done", "INFO step 2 done", "INFO step 3 done"]
    assert w.log_count == 3


def test_watcher_with_no_events_yet(tmp_path, run_factory):
    run = run_factory(steps=0, plan=False, samples=False)
    w = RunWatcher(run)
    w.refresh()
    assert len(w.table) == 0 and w.plan is None and w.samples_at(1) == []
    assert w.status.status == "running" and w.status.total_steps == 10


def test_100k_steps_load_then_refresh_reads_only_new_bytes(tmp_path):
    """A long run loads in chunks, and afterwards a refresh costs only the appended line."""
    run = tmp_path / "long"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"name": "long", "status": "running", "step": 100000,
                                                 "total_steps": 200000, "pid": os.getpid(),
                                                 "hostname": socket.gethostname()}))
    line = '{"step": %d, "time": %d.5, "reward/mean": %d.25, "timing/generate": 0.5}\n'
    with open(run / "events.jsonl", "w") as f:
        f.write("".join(line % (s, s, s % 7) for s in range(1, 100_001)))
    size = (run / "events.jsonl").stat().st_size

    w = RunWatcher(run, chunk_bytes=1 << 20)
    refreshes = 0
    while True:
        w.refresh()
        refreshes += 1
        if not w.pending():
            break
    assert len(w.table) == 100_000 and w.table.steps[-1] == 100_000
    assert refreshes > 1  # loaded in chunks, so a UI can redraw in between
    assert w.events.offset == w.events.bytes_read == size  # every byte read exactly once

    new = line % (100_001, 100_001, 3)
    with open(run / "events.jsonl", "a") as f:
        f.write(new)
    w.refresh()
    assert w.events.bytes_read - size == len(new)  # only the new bytes
    assert len(w.table) == 100_001 and w.table.value("reward/mean", 100_000) == 3.25


def test_read_status_tolerates_foreign_values(tmp_path):
    run = tmp_path / "odd"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"status": "running", "step": "7", "started": "yesterday",
                                                 "pid": "123", "hostname": socket.gethostname(), "error": 3}))
    st = read_status(run)
    assert (st.step, st.started, st.pid, st.error, st.status) == (0, None, None, "3", "running")


def test_events_file_briefly_missing_keeps_table(tmp_path, run_factory):
    run = run_factory(steps=3)
    w = RunWatcher(run)
    w.refresh()
    (run / "events.jsonl").rename(run / "moved")
    w.refresh()
    assert len(w.table) == 3


def test_metric_table_step_0_eval_and_sparse_eval_columns():
    """The trainer's step-0 event holds eval/* alone (the baseline); later evals come every k steps."""
    table = MetricTable()
    table.add({"step": 0, "time": 1.0, "eval/accuracy": 0.25, "eval/reward": 0.25})
    for step in (1, 2):
        table.add({"step": step, "time": 1.0 + step, "reward/mean": 0.1 * step,
                   **({"eval/accuracy": 0.5, "eval/reward": 0.5} if step == 2 else {})})
    assert list(table.steps) == [0, 1, 2]
    acc = table.column("eval/accuracy")
    assert acc[0] == 0.25 and math.isnan(acc[1]) and acc[2] == 0.5
    assert math.isnan(table.column("reward/mean")[0])
    assert table.stats("eval/accuracy") == (0.375, 0.5)
    table.add({"step": 1, "time": 9.0, "reward/mean": 0.7})  # resumed after step 0: the baseline stays
    assert list(table.steps) == [0, 1] and table.column("eval/accuracy")[0] == 0.25
