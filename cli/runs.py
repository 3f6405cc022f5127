"""`hflow runs`: one line per run directory, oldest first.

Reads only status.json, recipe.yaml and the last few KiB of events.jsonl
per run, so listing a folder of long runs stays instant.
"""

from __future__ import annotations

import math
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hflow.trainer.rundir.read import RunDirError, find_runs, read_last_event, read_status, start_time

STATUS_STYLE = {"running": "green", "finished": "blue", "failed": "red"}
WHY_CHARS = 160  # of a failed run's reason shown in the table (status.json holds all of it)


@dataclass
class RunRow:
    """What `hflow runs` shows of one run."""

    name: str
    algorithm: str
    model: str
    step: int
    total_steps: int
    last_reward: float | None
    status: str
    started: float
    why: str = ""  # a failed run's reason, its first line


def run_row(run_dir: Path) -> RunRow:
    st = read_status(run_dir)
    last = read_last_event(run_dir) or {}
    reward = last.get("reward/mean")
    step = max(st.step, int(last["step"]) if isinstance(last.get("step"), int) else 0)
    return RunRow(
        name=run_dir.name,
        algorithm=st.algorithm,
        model=st.model,
        step=step,
        total_steps=st.total_steps,
        last_reward=float(reward) if isinstance(reward, (int, float)) else None,
        status=st.status + (" (crashed)" if st.crashed else ""),
        started=start_time(run_dir, st),
        why=(st.error or "").strip().splitlines()[0][:WHY_CHARS] if st.status == "failed" or st.crashed else "",
    )


def shown(value: object) -> str:
    """A value read from a run directory as the terminal may show it: control and format characters
    (escape sequences, bidirectional overrides) dropped, Rich markup escaped. A run directory may
    come from someone else, and its status.json is any text they chose."""
    text = "".join(ch for ch in str(value) if unicodedata.category(ch) not in ("Cc", "Cf"))
    return escape(text)


def runs_table(rows: list[RunRow], root: Path) -> Table:
    table = Table(title=f"runs in {shown(root)}", title_justify="left")
    for col, justify in (("name", "left"), ("algorithm", "left"), ("model", "left"), ("steps", "right"),
                         ("last reward", "right"), ("status", "left"), ("started", "left"), ("why", "left")):
        table.add_column(col, justify=justify, no_wrap=col in ("name", "status", "started"))
    for r in rows:
        reward = "–" if r.last_reward is None or math.isnan(r.last_reward) else f"{r.last_reward:.4g}"
        steps = f"{r.step}/{r.total_steps}" if r.total_steps else str(r.step)
        status_key = (r.status.split() or [""])[0]
        status = shown(r.status)
        table.add_row(shown(r.name), shown(r.algorithm), shown(r.model), steps, reward,
                      f"[{STATUS_STYLE[status_key]}]{status}[/]" if status_key in STATUS_STYLE else status,
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started)), shown(r.why))
    return table


def runs(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Folder holding run directories.")] = Path("runs"),
) -> None:
    """List the runs under DIR: name, algorithm, model, steps, last reward, status, start time and,
    for a failed run, why.

    A run marked running whose process is gone on this host is shown as failed (crashed).
    """
    try:
        run_dirs = find_runs(directory)
    except RunDirError as e:
        typer.echo(f"hflow runs: {e}", err=True)
        raise typer.Exit(2) from None
    if not run_dirs:
        typer.echo(f"hflow runs: {directory}: no runs found (run directories are written by `hflow train`)", err=True)
        return
    rows = sorted((run_row(d) for d in run_dirs), key=lambda r: (r.started, r.name))
    table, console = runs_table(rows, directory), Console()
    if not console.is_terminal:  # piped (`| cat`, a file): the table's natural width, never squeezed to 80 columns
        natural = console.measure(table, options=console.options.update(max_width=10_000)).maximum
        console = Console(width=max(console.width, natural))
    console.print(table)
