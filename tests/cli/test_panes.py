"""The monitor's pane functions: values computed from the metric table, without a terminal."""

from __future__ import annotations

import json

import pytest

from hflow.cli.monitor import panes
from hflow.trainer.rundir.metrics import MetricTable
from hflow.trainer.rundir.watcher import RunWatcher


def table_of(events: list[dict]) -> MetricTable:
    t = MetricTable()
    for ev in events:
        t.add(ev)
    return t


def test_stage_times_latest_and_average():
    t = table_of([
        {"step": 1, "timing/generate": 1.0, "timing/update_actor": 3.0, "timing/step": 4.5},
        {"step": 2, "timing/generate": 2.0, "timing/update_actor": 1.0, "timing/step": 3.5},
    ])
    assert panes.stage_times(t, 1) == [("generate", 2.0, 1.5), ("update_actor", 1.0, 2.0)]
    text = panes.timing(t, 1, width=80).plain
    assert "step 2   total 3.500s   (other 0.500s)" in text
    assert "generate" in text and "2.000s   67%   avg    1.500s" in text
    assert "update_actor" in text and "1.000s   33%   avg    2.000s" in text


def test_stacked_bar_is_proportional():
    bar = panes.stacked_bar([("a", 1.0), ("b", 3.0)], width=40)
    assert bar.plain == "█" * 40
    assert [(span.end - span.start) for span in bar.spans] == [10, 30]


def test_eta_from_recent_pace():
    t = table_of([{"step": s, "time": 100.0 + 2.0 * s} for s in range(1, 11)])
    assert panes.eta_seconds(t, 10, 20) == pytest.approx(20.0)  # 2 s per step, 10 steps left
    assert panes.eta_seconds(t, 20, 20) is None


def test_header_of_failed_run_shows_error(run_factory):
    run = run_factory(status="failed", steps=3)
    w = RunWatcher(run)
    w.refresh()
    text = panes.header(w, cursor=2, follow=True).plain
    assert "failed" in text and "CUDA out of memory" in text and "step 3 of 10" in text
    assert "ETA" not in text and "elapsed 6s" in text  # updated - started = 2 s/step * 3


def test_other_metrics_lists_unknown_keys(run_factory):
    run = run_factory(steps=2)
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "my/custom": 42.0, "phase": "warmup"}) + "\n")
    w = RunWatcher(run)
    w.refresh()
    table = panes.other_metrics(w.table, 2)
    keys = list(table.columns[0].cells)
    assert "my/custom" in keys and "actor/lr" in keys and "phase" in keys
    assert "reward/mean" not in keys and not any(k.startswith(("timing/", "memory/")) for k in keys)
    assert list(table.columns[1].cells)[keys.index("my/custom")] == "42"


def test_formatters():
    assert [panes.fmt_duration(s) for s in (5, 125, 7260, 200_000, None)] == ["5s", "2m05s", "2h01m", "2d07h", "–"]
    assert panes.fmt_bytes(3 * 2**30) == "3.0 GiB" and panes.fmt_bytes(512) == "512 B"


def test_held_out_sets_table_first_evaluation_to_the_cursor():
    from hflow.cli.monitor import eval_pane

    t = table_of([
        {"step": 0, "eval/accuracy": 0.25, "eval/first/accuracy": 0.5, "eval/first/pass@4": 0.75},
        {"step": 1, "reward/mean": 0.1},
        {"step": 2, "eval/accuracy": 0.5, "eval/first/accuracy": 0.625, "eval/first/pass@4": 0.875,
         "eval/first/cutoff_share": 0.125},
        {"step": 3, "reward/mean": 0.2, "my/custom": 1.0},
    ])
    assert eval_pane.eval_keys(t) == {"data.eval": {"accuracy": "eval/accuracy"},
                                      "first": {"accuracy": "eval/first/accuracy", "pass@4": "eval/first/pass@4",
                                                "cutoff_share": "eval/first/cutoff_share"}}
    table = eval_pane.eval_sets(t, 3)  # step 3 has no evaluation: step 2's are the latest
    assert [c.header for c in table.columns] == ["set", "accuracy", "pass@4", "cutoff share"]
    rows = list(zip(*[list(c.cells) for c in table.columns]))
    assert rows == [("data.eval", "0.25 -> 0.5", "", ""), ("first", "0.5 -> 0.625", "0.75 -> 0.875", "0.125 -> 0.125")]
    assert [r[1] for r in zip(*[list(c.cells) for c in eval_pane.eval_sets(t, 1).columns])] == ["0.25 -> 0.25",
                                                                                                 "0.5 -> 0.5"]
    assert "eval/first/pass@4" not in list(panes.other_metrics(t, 3).columns[0].cells)  # shown in the table instead
