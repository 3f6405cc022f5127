"""Console output of a run: a live bar with ETA on a terminal, one line per step otherwise,
and a summary at the end."""

from __future__ import annotations

import sys
import time
from typing import Any

KEYS = [("reward/mean", "reward", "{:.3f}"), ("kl/mean", "kl", "{:.4f}"),
        ("response_length/mean", "len", "{:.1f}"), ("actor/loss", "loss", "{:+.4f}"),
        ("eval/accuracy", "eval acc", "{:.3f}"), ("async/staleness_mean", "stale", "{:.2f}"),
        ("timing/step", "s/step", "{:.2f}")]


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def metrics_line(event: dict[str, Any]) -> str:
    return "  ".join(f"{label} {fmt.format(event[key])}" for key, label, fmt in KEYS if key in event)


class Progress:
    def __init__(self, total: int, mode: str = "auto", stream=None):
        self.total = total
        self.stream = stream or sys.stderr
        self.live = mode == "bar" or (mode == "auto" and self.stream.isatty())
        self._bar = None
        self._first = 0
        self._t0 = 0.0

    def start(self, done: int) -> None:
        self._first, self._t0 = done, time.perf_counter()
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), TextColumn("{task.fields[line]}"),
                                     console=Console(file=self.stream))
            self._task = self._bar.add_task("train", total=self.total, completed=done, line="")
            self._bar.start()

    def update(self, step: int, event: dict[str, Any]) -> None:
        line = metrics_line(event)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, line=line)
            return
        rate = (time.perf_counter() - self._t0) / max(1, step - self._first)
        eta = _fmt_duration(rate * (self.total - step))
        print(f"step {step}/{self.total}  {line}  eta {eta}", file=self.stream, flush=True)

    def close(self, events: list[dict[str, Any]] | None) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if events is None:  # a failed run: no summary
            return
        evals = [e for e in events if "eval/accuracy" in e]
        events = [e for e in events if e["step"] > 0]  # step 0 is the baseline evaluation alone
        if not events:
            return
        window = min(10, len(events) // 2) or 1  # first and last windows never overlap
        first, last = events[:window], events[-window:]

        def mean(rows, key):
            values = [r[key] for r in rows if key in r]
            return sum(values) / len(values) if values else float("nan")

        total_s = sum(e.get("timing/step", 0.0) for e in events)
        print(f"done: {len(events)} steps in {_fmt_duration(total_s)}; reward/mean first {window} steps "
              f"{mean(first, 'reward/mean'):.3f} -> last {window} steps {mean(last, 'reward/mean'):.3f}",
              file=self.stream, flush=True)
        if len(evals) > 1:
            print(f"eval/accuracy step {evals[0]['step']} {evals[0]['eval/accuracy']:.3f} -> step "
                  f"{evals[-1]['step']} {evals[-1]['eval/accuracy']:.3f}", file=self.stream, flush=True)
