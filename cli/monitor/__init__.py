"""`hflow monitor`: watch a run directory in a terminal UI, live or after the fact.

The command resolves and checks the run directory, then hands it to the
Textual app in ``app.py``. Textual is imported only here, on use, so other
commands (and `hflow --help`) do not pay for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hflow.trainer.rundir.read import RunDirError, check_run_dir, newest_run

DEFAULT_RUNS = Path("runs")


def resolve_run_dir(run_dir: Path | None) -> Path:
    """The run to show: ``run_dir``, or the newest run under ./runs. Raises RunDirError."""
    if run_dir is not None:
        return check_run_dir(run_dir)
    try:
        return newest_run(DEFAULT_RUNS)
    except RunDirError as e:
        raise RunDirError(f"no RUN_DIR given and {e}") from None


def monitor(
    run_dir: Annotated[
        Optional[Path],
        typer.Argument(
            metavar="RUN_DIR",
            help="Run directory written by `hflow train` (default: the newest run under ./runs).",
            show_default=False,
        ),
    ] = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between reads of the run's files.")] = 1.0,
) -> None:
    """Watch a training run in a terminal UI: metric charts, stage timings, placement, log and samples.

    Follows events.jsonl as it grows; a finished or crashed run is shown the same way.
    Keys: q quit, tab next pane, f follow, left/right scrub steps, ? help.
    """
    try:
        path = resolve_run_dir(run_dir)
    except RunDirError as e:
        typer.echo(f"hflow monitor: {e}", err=True)
        raise typer.Exit(2) from None
    from hflow.cli.monitor.app import MonitorApp  # textual: loaded only by `hflow monitor`

    MonitorApp(path, interval=interval).run()
