"""Draw a run's learning curves from its `events.jsonl` as an SVG file, with no plotting library:
one panel per key, steps on the x axis, the values as a line and their range on the y axis.

    python docs/scripts/learning_curve.py RUN_DIR OUT.svg [--keys reward/mean,kl/mean]

The benchmarks page's curve comes from a `grpo/quickstart` run (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from xml.sax.saxutils import escape

WIDTH, PANEL_HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 36
COLOURS = ("#3f51b5", "#e65100", "#2e7d32", "#6a1b9a")


def read_series(run_dir: Path, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) pairs of each key, from every event with a finite value; step-0 events (an
    evaluation before training) included."""
    series: dict[str, list[tuple[int, float]]] = {k: [] for k in keys}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        for key in keys:
            value = event.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                series[key].append((int(event["step"]), float(value)))
    empty = [k for k, points in series.items() if not points]
    if empty:
        raise SystemExit(f"{run_dir / 'events.jsonl'}: no values for {', '.join(empty)}")
    return series


def _ticks(low: float, high: float, count: int = 4) -> list[float]:
    """About `count` round values spanning [low, high]."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def panel(key: str, points: list[tuple[int, float]], top: float, colour: str) -> list[str]:
    """SVG elements of one key's panel, its plot area starting `top` pixels down."""
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PANEL_HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + (step - x0) / max(x1 - x0, 1) * plot_w

    def y(value: float) -> float:
        return top + TOP + (y1 - value) / (y1 - y0) * plot_h

    out = [f'<text x="{LEFT}" y="{top + 18}" class="title">{escape(key)}</text>',
           f'<rect x="{LEFT}" y="{top + TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>']
    for tick in _ticks(y0, y1):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" class="grid"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" class="ylabel">{_label(tick)}</text>')
    for tick in _ticks(x0, x1, 6):
        out.append(f'<text x="{x(tick):.1f}" y="{top + TOP + plot_h + 16}" class="xlabel">{_label(tick)}</text>')
    path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
    out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
    return out


def render(series: dict[str, list[tuple[int, float]]], title: str) -> str:
    height = PANEL_HEIGHT * len(series) + 24
    body = [f'<text x="{LEFT}" y="16" class="heading">{escape(title)}</text>']
    for i, (key, points) in enumerate(series.items()):
        body += panel(key, points, 24 + i * PANEL_HEIGHT, COLOURS[i % len(COLOURS)])
    body.append(f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2:.0f}" y="{height - 4}" class="xlabel">step</text>')
    style = ("text{font-family:sans-serif;font-size:11px;fill:#333}"
             ".heading{font-size:13px;font-weight:bold}.title{font-size:12px}"
             ".ylabel{text-anchor:end}.xlabel{text-anchor:middle}"
             ".frame{fill:none;stroke:#999}.grid{stroke:#e0e0e0}")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}"><style>{style}</style>'
            f'<rect width="100%" height="100%" fill="white"/>' + "".join(body) + "</svg>\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--keys", default="reward/mean,kl/mean", help="comma-separated events.jsonl keys")
    args = parser.parse_args()
    series = read_series(args.run_dir, args.keys.split(","))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(series, args.run_dir.resolve().name))
    print(args.out)


if __name__ == "__main__":
    main()
