"""Line charts drawn with Unicode braille, sized to the widget, over any number of steps.

A braille cell is 2x4 dots, so a chart W cells wide has 2W dot columns. A
series longer than that is downsampled first (one bucket per dot column:
mean for the line, min/max of the band), which keeps drawing cost fixed by
the terminal size whatever the run length — 100,000 steps draw as fast as
100. Drawing is our own (numpy + rich Text) to avoid a plotting dependency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual.widget import Widget

from hflow.trainer.rundir.metrics import MetricTable

# Dot (dx, dy) of a braille cell -> bit of U+2800 + bits (Unicode braille patterns).
_BRAILLE_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.int64)
LABEL_WIDTH = 9


def fmt_num(v: float) -> str:
    """Short human number: 3 significant digits, k/M/G suffixes."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    if a != 0 and a < 1e-3:
        return f"{v:.2e}"
    return f"{v:.3g}"


@dataclass
class Series:
    """What to draw: one value per row for the line, and optionally a band (lo, hi)."""

    line: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None


def downsample(values: np.ndarray, buckets: int, how: str = "mean") -> np.ndarray:
    """Reduce ``values`` to ``buckets`` points (NaN-aware mean, min or max).

    Bucket b covers rows [n*b/buckets, n*(b+1)/buckets). Uses ``reduceat`` so the
    cost is one pass over the array, no Python loop per row.
    """
    n = len(values)
    if n <= buckets:
        return values
    starts = (np.arange(buckets, dtype=np.int64) * n) // buckets
    if how == "min":
        return np.fmin.reduceat(values, starts)  # fmin ignores NaN
    if how == "max":
        return np.fmax.reduceat(values, starts)
    ok = ~np.isnan(values)
    sums = np.add.reduceat(np.where(ok, values, 0.0), starts)
    counts = np.add.reduceat(ok.astype(np.int64), starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _x_of(n: int, cols: int) -> np.ndarray:
    """Dot column of each (downsampled) point: spread across the width."""
    if n <= 1:
        return np.zeros(n, dtype=np.int64)
    return np.round(np.arange(n) * (cols - 1) / (n - 1)).astype(np.int64)


def cursor_column(row: int, n: int, cols: int) -> int:
    """Dot column where data row ``row`` of ``n`` is drawn."""
    if n <= cols:
        return int(_x_of(n, cols)[row]) if n else 0
    return min(row * cols // n, cols - 1)


def value_range(s: Series) -> tuple[float, float]:
    parts = [a for a in (s.line, s.lo, s.hi) if a is not None and a.size]
    finite = np.concatenate(parts) if parts else np.array([])
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    return lo, hi


def rasterize(s: Series, cols: int, rows: int, vmin: float, vmax: float) -> tuple[np.ndarray, np.ndarray]:
    """Dot grids (rows x cols, bool) of the line and the band.

    The line is connected: each column fills the dots between its value and
    the previous column's, so steep changes read as a stroke, not dust.
    """
    line = downsample(s.line, cols)
    n = len(line)
    xs = _x_of(n, cols)
    scale = (rows - 1) / (vmax - vmin)

    def to_row(v: np.ndarray) -> np.ndarray:
        r = np.round((vmax - v) * scale)
        return np.clip(np.nan_to_num(r, nan=-1), -1, rows - 1).astype(np.int64)

    line_grid = np.zeros((rows, cols), dtype=bool)
    band_grid = np.zeros((rows, cols), dtype=bool)
    if s.lo is not None and s.hi is not None:
        lo_r, hi_r = to_row(downsample(s.lo, cols, "min")), to_row(downsample(s.hi, cols, "max"))
        for x, a, b in zip(xs, hi_r, lo_r):
            if a >= 0 and b >= 0:
                band_grid[min(a, b) : max(a, b) + 1, x] = True
    rs = to_row(line)
    ok = np.isfinite(line)
    prev = None
    for i in np.flatnonzero(ok):
        x, r = int(xs[i]), int(rs[i])
        line_grid[r, x] = True
        if prev is not None:
            px, pr = prev
            for xx in range(px + 1, x + 1):  # stroke from the previous point, column by column
                y0 = round(pr + (r - pr) * (xx - 1 - px) / (x - px))
                y1 = round(pr + (r - pr) * (xx - px) / (x - px))
                line_grid[min(y0, y1) : max(y0, y1) + 1, xx] = True
        prev = (x, r)
    return line_grid, band_grid


def to_braille(grid: np.ndarray) -> np.ndarray:
    """(4H x 2W) bool dots -> (H x W) int braille bit masks."""
    h, w = grid.shape[0] // 4, grid.shape[1] // 2
    cells = grid[: h * 4, : w * 2].reshape(h, 4, w, 2)
    return np.einsum("hywx,yx->hw", cells.astype(np.int64), _BRAILLE_BITS)


def render_chart(
    s: Series,
    width: int,
    height: int,
    cursor: int | None = None,
    color: str = "cyan",
    steps: np.ndarray | None = None,
) -> list[Text]:
    """``height`` lines of ``width`` cells: y labels, braille plot, x labels below."""
    plot_w, plot_h = max(width - LABEL_WIDTH, 2), max(height - 1, 1)
    cols, rows = plot_w * 2, plot_h * 4
    vmin, vmax = value_range(s)
    line_grid, band_grid = rasterize(s, cols, rows, vmin, vmax)
    line_bits, band_bits = to_braille(line_grid), to_braille(band_grid)
    n = len(s.line)
    cur_cell = cursor_column(cursor, n, cols) // 2 if cursor is not None and n else None
    labels = {0: fmt_num(vmax), plot_h - 1: fmt_num(vmin)}
    out = []
    for y in range(plot_h):
        t = Text(labels.get(y, "").rjust(LABEL_WIDTH - 1) + "┤" if y in labels else " " * (LABEL_WIDTH - 1) + "│",
                 style="dim")
        for x in range(plot_w):
            lb, bb = int(line_bits[y, x]), int(band_bits[y, x])
            style = color if lb else (f"dim {color}" if bb else "")
            if x == cur_cell:
                style = (style + " on grey30").strip()
            t.append(chr(0x2800 + (lb | bb)) if (lb or bb) else " ", style)
        out.append(t)
    first = str(int(steps[0])) if steps is not None and len(steps) else ""
    last = str(int(steps[-1])) if steps is not None and len(steps) else ""
    axis = " " * (LABEL_WIDTH - 1) + "└" + first
    axis += last.rjust(max(width - len(axis), len(last) + 1))
    out.append(Text(axis[:width], style="dim"))
    return out


@dataclass
class ChartSpec:
    """One chart: its title, the key of its line and how to find its band."""

    title: str
    key: str
    band: tuple[str, str] | None = None  # (lo key, hi key), e.g. reward/min, reward/max
    std: str | None = None  # fallback band: key +- std
    color: str = "cyan"


def series_of(table: MetricTable, spec: ChartSpec) -> Series | None:
    """The chart's arrays (copies), or None when its key never appeared."""
    col = table.column(spec.key)
    if col is None:
        return None
    line = np.array(col, dtype=np.float64)
    if spec.band and table.column(spec.band[0]) is not None and table.column(spec.band[1]) is not None:
        return Series(line, np.array(table.column(spec.band[0])), np.array(table.column(spec.band[1])))
    if spec.std and table.column(spec.std) is not None:
        std = np.array(table.column(spec.std))
        return Series(line, line - std, line + std)
    return Series(line)


class Chart(Widget):
    """A titled braille chart of one metric over steps, with a cursor column.

    ``set_data`` is cheap (it stores a reference); arrays are copied and drawn
    only when the table grew, the cursor moved or the widget was resized.
    """

    DEFAULT_CSS = "Chart { height: 10; border: round $panel; padding: 0 1; }"

    def __init__(self, spec: ChartSpec, **kw):
        super().__init__(**kw)
        self.spec = spec
        self.table: MetricTable | None = None
        self.cursor: int | None = None
        self.series: Series | None = None
        self._series_len = -1
        self._cache_key = None
        self._lines: list[Text] = []
        self.border_title = spec.title

    def set_data(self, table: MetricTable, cursor: int | None) -> None:
        self.table, self.cursor = table, cursor
        if len(table) != self._series_len or self.series is None:
            self.series = series_of(table, self.spec)
            self._series_len = len(table)
        self.display = self.series is not None
        self.border_subtitle = self.caption()
        self.refresh()

    def value_at(self, row: int | None) -> float:
        if self.series is None or row is None or not 0 <= row < len(self.series.line):
            return math.nan
        return float(self.series.line[row])

    def caption(self) -> str:
        """Latest and cursor values, shown in the border."""
        if self.series is None or self.table is None or not len(self.table):
            return ""
        row = self.cursor if self.cursor is not None else len(self.table) - 1
        # Sparse keys (eval/* every k steps): the latest value at or before the row.
        line = self.series.line[:row + 1]
        finite = np.flatnonzero(np.isfinite(line))
        if finite.size:
            row = int(finite[-1])
        text = f"step {self.table.steps[row]}: {fmt_num(self.value_at(row))}"
        if self.series.lo is not None:
            text += f" [{fmt_num(self.series.lo[row])} … {fmt_num(self.series.hi[row])}]"
        return text

    def chart_lines(self, width: int, height: int) -> list[Text]:
        key = (self._series_len, width, height, self.cursor)
        if key != self._cache_key:
            if self.series is None or not len(self.series.line):
                self._lines = [Text("no data yet", style="dim")]
            else:
                steps = np.array(self.table.steps) if self.table is not None else None
                self._lines = render_chart(self.series, width, height, self.cursor, self.spec.color, steps)
            self._cache_key = key
        return self._lines

    def render(self) -> Text:
        w, h = self.content_size.width, self.content_size.height
        if w < LABEL_WIDTH + 4 or h < 2:
            return Text("")
        return Text("\n").join(self.chart_lines(w, h))
