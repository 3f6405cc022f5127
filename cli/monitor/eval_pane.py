"""The monitor's table of held-out sets: one row per set (`data.eval`, then each of `eval.sets`),
its metrics at the first evaluation and at the cursor's step (evaluations are sparse: the latest
at or before it), so that what training did to each set reads at a glance."""

from __future__ import annotations

import math
import re

from rich.table import Table
from rich.text import Text

from hflow.cli.monitor.charts import fmt_num
from hflow.trainer.rundir.metrics import MetricTable

# eval/<metric> (data.eval) or eval/<set>/<metric>; the run-level and sampled metrics come after the greedy ones.
_KEY = re.compile(r"eval/(?:(?P<set>[^/]+)/)?(?P<metric>[^/]+)")
_ORDER = ["accuracy", "pass@", "mean@", "cutoff_share", "response_length", "reward", "tool_call_share"]


def eval_keys(table: MetricTable) -> dict[str, dict[str, str]]:
    """{set name ("data.eval" for its own): {metric: key}} of every eval/* key in the table."""
    sets: dict[str, dict[str, str]] = {}
    for key in table.keys("eval/"):
        match = _KEY.fullmatch(key)
        if match:
            sets.setdefault(match["set"] or "data.eval", {})[match["metric"]] = key
    return sets


def _rank(metric: str) -> int:
    return next((i for i, start in enumerate(_ORDER) if metric.startswith(start)), len(_ORDER))


def _at_or_before(table: MetricTable, key: str, row: int) -> float:
    for i in range(row, -1, -1):
        value = table.value(key, i)
        if math.isfinite(value):
            return value
    return math.nan


def _first(table: MetricTable, key: str) -> float:
    return next((v for v in table.column(key) or () if math.isfinite(v)), math.nan)


def eval_sets(table: MetricTable, row: int | None) -> Table | Text:
    """Each held-out set's metrics: first evaluation -> the latest at or before ``row``."""
    sets = eval_keys(table)
    if row is None or not sets:
        return Text("")
    metrics = sorted({m for keys in sets.values() for m in keys}, key=lambda m: (_rank(m), m))
    t = Table(title=f"held-out sets (first evaluation -> step {table.steps[row]})", title_justify="left", box=None)
    t.add_column("set", style="bold")
    for metric in metrics:
        t.add_column(metric.replace("_", " "), justify="right")
    for name, keys in sets.items():
        cells = []
        for metric in metrics:
            key = keys.get(metric)
            cells.append("" if key is None else
                         f"{fmt_num(_first(table, key))} -> {fmt_num(_at_or_before(table, key, row))}")
        t.add_row(name, *cells)
    return t
