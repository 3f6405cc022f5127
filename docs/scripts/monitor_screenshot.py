"""Save a screenshot of `hflow monitor` on a run directory as SVG, rendered by Textual itself: the
app runs headless (`App.run_test`) at a fixed terminal size, waits until the run's events are
loaded, and `App.save_screenshot` writes what the terminal would show.

    python docs/scripts/monitor_screenshot.py RUN_DIR OUT.svg [--size 120x42]

The monitoring page's screenshot is of a finished `grpo/quickstart` run (docs/monitoring.md).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from hflow.cli.monitor.app import MonitorApp


async def screenshot(run_dir: Path, out: Path, size: tuple[int, int], timeout_s: float = 30.0) -> Path:
    app = MonitorApp(run_dir, interval=0.1)
    async with app.run_test(size=size) as pilot:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # The monitor reads the run's files on a timer: wait until every event is in its table.
        while app.watcher.table is None or len(app.watcher.table) == 0 or app._catching_up:
            if loop.time() > deadline:
                raise SystemExit(f"{run_dir}: no events loaded within {timeout_s:.0f} s")
            await pilot.pause(0.1)
        await pilot.pause(0.5)
        path = app.save_screenshot(filename=out.name, path=str(out.parent))
    return Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", default="120x42", help="terminal columns x rows")
    args = parser.parse_args()
    columns, rows = (int(v) for v in args.size.split("x"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(asyncio.run(screenshot(args.run_dir, args.out, (columns, rows))))


if __name__ == "__main__":
    main()
