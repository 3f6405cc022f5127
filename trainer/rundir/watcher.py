"""The monitor's live view of a run directory, kept current by reading only what is new."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from hflow.trainer.rundir.layout import EVENTS, LOG, PLAN, RECIPE, SAMPLES
from hflow.trainer.rundir.metrics import MetricTable
from hflow.trainer.rundir.read import read_plan, read_recipe, read_status
from hflow.trainer.rundir.tail import JsonlTail, LineTail


class RunWatcher:
    """Everything the monitor shows, kept current by ``refresh()``.

    Each refresh reads only appended bytes of the JSONL files and the log,
    and re-reads the small JSON files only when their mtime changed.
    """

    def __init__(self, run_dir: Path, chunk_bytes: int = 4 << 20, keep_samples: int = 1000, keep_log: int = 500):
        self.run_dir = Path(run_dir)
        self.chunk_bytes = chunk_bytes
        self.events = JsonlTail(self.run_dir / EVENTS)
        self.samples_tail = JsonlTail(self.run_dir / SAMPLES)
        self.log_tail = LineTail(self.run_dir / LOG, start_near_end=64 << 10)
        self.table = MetricTable()
        self.samples: deque[dict] = deque(maxlen=keep_samples)
        self.log_lines: deque[str] = deque(maxlen=keep_log)
        self.log_count = 0  # lines of train.log read so far, so a view can append only new ones
        self.recipe = read_recipe(self.run_dir)
        self.status = read_status(self.run_dir, self.recipe)
        self.plan = read_plan(self.run_dir)
        self._mtimes: dict[str, float] = {}

    def _changed(self, name: str) -> bool:
        try:
            m = (self.run_dir / name).stat().st_mtime_ns
        except OSError:
            m = -1
        changed = self._mtimes.get(name) != m
        self._mtimes[name] = m
        return changed

    def refresh(self) -> bool:
        """Read what is new; True when anything the monitor shows changed."""
        changed = False
        resets = self.events.resets
        events = self.events.poll_objects(self.chunk_bytes)
        if self.events.resets != resets:
            self.table = MetricTable()  # file was rewritten: start over
        for ev in events:
            self.table.add(ev)
        changed |= bool(events)
        new_samples = self.samples_tail.poll_objects(self.chunk_bytes)
        self.samples.extend(new_samples)
        new_log = self.log_tail.poll(self.chunk_bytes)
        self.log_lines.extend(ln.decode("utf-8", "replace").rstrip("\r") for ln in new_log)
        self.log_count += len(new_log)
        changed |= bool(new_samples or new_log)
        if self._changed(RECIPE):
            self.recipe = read_recipe(self.run_dir)
        # status.json must be re-read even if unchanged: a dead pid flips it to failed.
        status = read_status(self.run_dir, self.recipe)
        changed |= status != self.status
        self.status = status
        if self._changed(PLAN):
            self.plan = read_plan(self.run_dir)
            changed = True
        return changed

    def pending(self) -> bool:
        """More event bytes are waiting than one refresh reads (initial load)."""
        return self.events.pending()

    def samples_at(self, step: int) -> list[dict]:
        """Samples of ``step``, or of the latest step before it that has some."""
        best: list[dict] = []
        best_step = None
        for s in reversed(self.samples):
            st = s.get("step")
            if not isinstance(st, int) or st > step:
                continue
            if best_step is None:
                best_step = st
            if st != best_step:
                break
            best.append(s)
        return best[::-1]
