"""Braille charts: downsampling and rasterizing, checked dot by dot on tiny cases."""

from __future__ import annotations

import math

import numpy as np

from hflow.cli.monitor.charts import (
    LABEL_WIDTH,
    ChartSpec,
    Series,
    cursor_column,
    downsample,
    fmt_num,
    rasterize,
    render_chart,
    series_of,
    to_braille,
)
from hflow.trainer.rundir.metrics import MetricTable


def test_downsample_mean_min_max_ignore_nan():
    v = np.array([1.0, 3.0, np.nan, 5.0, 2.0, 4.0])
    assert downsample(v, 3).tolist() == [2.0, 5.0, 3.0]
    assert downsample(v, 3, "min").tolist() == [1.0, 5.0, 2.0]
    assert downsample(v, 3, "max").tolist() == [3.0, 5.0, 4.0]
    assert downsample(v, 10) is v  # already fits


def test_downsample_all_nan_bucket_stays_nan():
    out = downsample(np.array([np.nan, np.nan, 1.0, 2.0]), 2)
    assert math.isnan(out[0]) and out[1] == 1.5


def test_braille_bits_follow_unicode_layout():
    grid = np.zeros((4, 2), dtype=bool)
    grid[0, 0] = grid[3, 1] = True  # dot 1 and dot 8
    assert chr(0x2800 + int(to_braille(grid)[0, 0])) == "⢁"


def test_rasterize_rising_line_is_connected():
    line, band = rasterize(Series(np.array([0.0, 1.0])), cols=2, rows=4, vmin=0.0, vmax=1.0)
    # first point bottom-left, second top-right, with a vertical stroke joining them
    assert line[:, 0].tolist() == [False, False, False, True]
    assert line[:, 1].all()
    assert not band.any()


def test_rasterize_band_covers_lo_to_hi():
    s = Series(np.array([0.5, 0.5]), lo=np.array([0.0, 0.0]), hi=np.array([1.0, 1.0]))
    _, band = rasterize(s, cols=2, rows=4, vmin=0.0, vmax=1.0)
    assert band.all()


def test_render_chart_size_labels_and_100k_points():
    n = 100_000
    y = np.arange(n, dtype=float)
    lines = render_chart(Series(y), width=60, height=8, cursor=n - 1, steps=np.arange(1, n + 1))
    assert len(lines) == 8 and all(len(t.plain) == 60 for t in lines)
    assert lines[0].plain.startswith(" " * (LABEL_WIDTH - len(fmt_num(n - 1)) - 1) + "100k┤")
    assert lines[-2].plain.lstrip().startswith("0┤")
    assert lines[-1].plain.rstrip().endswith("100000")
    # a rising line: its top-right cell is drawn, its top-left is blank
    assert lines[0].plain[-1] != " " and lines[0].plain[LABEL_WIDTH] == " "


def test_cursor_column_maps_rows_to_dots():
    assert cursor_column(0, 5, 100) == 0 and cursor_column(4, 5, 100) == 99
    assert cursor_column(50_000, 100_000, 100) == 50


def test_series_band_prefers_min_max_then_std():
    t = MetricTable()
    t.add({"step": 1, "reward/mean": 1.0, "reward/std": 0.5})
    spec = ChartSpec("reward", "reward/mean", band=("reward/min", "reward/max"), std="reward/std")
    s = series_of(t, spec)
    assert (s.lo.tolist(), s.hi.tolist()) == ([0.5], [1.5])
    t.add({"step": 2, "reward/mean": 1.0, "reward/min": 0.0, "reward/max": 3.0})
    s = series_of(t, spec)
    assert s.hi.tolist()[1] == 3.0
    assert series_of(t, ChartSpec("cost", "cost/mean")) is None


def test_fmt_num():
    assert [fmt_num(v) for v in (0.0, 0.123456, 1234.0, 2.5e6, 3e-5, math.nan)] == [
        "0", "0.123", "1.23k", "2.5M", "3.00e-05", "–"]


def test_eval_chart_of_sparse_eval_points():
    """eval/* arrive at step 0 and every k steps: the chart joins those points, and its caption
    shows the latest eval at or before the cursor (not a blank for steps without one)."""
    from hflow.cli.monitor.charts import Chart
    from hflow.cli.monitor.panes import CHARTS

    spec = next(s for s in CHARTS if s.key == "eval/accuracy")
    table = MetricTable()
    table.add({"step": 0, "eval/accuracy": 0.25})
    for step in range(1, 5):
        table.add({"step": step, "reward/mean": 0.1, **({"eval/accuracy": 0.75} if step == 4 else {})})
    chart = Chart(spec)
    chart.table, chart.series = table, series_of(table, spec)
    chart.cursor = 2
    assert chart.caption() == "step 0: 0.25"
    chart.cursor = 4
    assert chart.caption() == "step 4: 0.75"
    lines = render_chart(chart.series, 40, 6)
    plot = "".join(str(t)[LABEL_WIDTH:] for t in lines[:-1])
    dots = sum(ch != " " for ch in plot)
    assert dots > 10  # a connected stroke from step 0 to step 4, not two isolated dots
