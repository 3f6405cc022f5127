"""A run directory as Python sees it: where it is, how it ended, its metrics and its model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hflow.trainer.rundir.layout import EVENTS, FINAL
from hflow.trainer.rundir.read import read_status
from hflow.trainer.rundir.writer import read_jsonl


@dataclass(frozen=True)
class Run:
    """One run directory (`hflow train`'s, or `hflow.train`'s return)."""

    path: Path

    @property
    def status(self) -> str:
        """running, finished or failed (a run whose process is gone reads as failed)."""
        st = read_status(self.path)
        return "failed" if st.crashed else st.status

    @property
    def error(self) -> str | None:
        """Why a failed run failed (status.json's one line), else None."""
        return read_status(self.path).error

    @property
    def metrics(self) -> list[dict]:
        """One dict per logged step (events.jsonl), in step order."""
        events = self.path / EVENTS
        return read_jsonl(events) if events.is_file() else []

    def table(self):
        """The metrics as a pandas DataFrame indexed by step (pandas must be installed)."""
        import pandas

        return pandas.DataFrame(self.metrics).set_index("step")

    @property
    def final_model(self) -> Path | None:
        """The exported model (a Hugging Face folder), once the run finished."""
        final = self.path / FINAL
        return final if (final / "config.json").is_file() else None
