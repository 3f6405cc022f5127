"""The Textual app behind `hflow monitor`: a thin view over ``RunWatcher``.

A timer calls ``refresh_data`` every ``interval`` seconds; the watcher reads
only what was appended since the last call. The view keeps one cursor (a
row of the metric table): in follow mode it sits on the newest step, and
left/right scrub it through history, which every pane then shows.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, RichLog, Static, TabbedContent, TabPane

from hflow.cli.monitor import eval_pane, panes
from hflow.cli.monitor.charts import Chart
from hflow.trainer.rundir.watcher import RunWatcher

HELP = """\
[b]hflow monitor[/b] — keys

  [b]q[/b]            quit
  [b]tab[/b]          next pane (shift+tab: previous)
  [b]f[/b]            toggle follow: on, the view tracks the newest step
  [b]← / →[/b]        scrub one step back / forward (turns follow off)
  [b]shift+← / →[/b]  scrub 10 steps
  [b]home / end[/b]   first step / newest step (end turns follow on)
  [b]?[/b]            this help (esc or ? closes it)

New lines of events.jsonl, samples.jsonl and train.log are read
whether or not follow is on; follow only decides where the cursor is.
"""


class HelpScreen(ModalScreen):
    DEFAULT_CSS = "HelpScreen { align: center middle; } HelpScreen > Static { width: 80; border: round $accent; padding: 1 2; background: $surface; }"
    BINDINGS = [Binding("escape", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help-text")


class MonitorApp(App):
    """Live view of one run directory."""

    TITLE = "hflow monitor"
    PANES = ("charts", "timing", "placement", "logs")
    CSS = """
    #header { height: 3; padding: 0 1; background: $boost; }
    TabbedContent, ContentSwitcher, TabPane { height: 1fr; }
    #chart-grid { layout: grid; grid-size: 2; grid-rows: 10; height: auto; }
    #other, #timing-view, #placement-view, #samples { padding: 0 1; height: auto; }
    #samples-scroll { height: auto; max-height: 50%; }
    #log { height: 1fr; border-top: solid $panel; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit", priority=True),
        Binding("tab", "next_pane", "next pane", priority=True),
        Binding("shift+tab", "next_pane(-1)", "previous pane", show=False, priority=True),
        Binding("f", "toggle_follow", "follow", priority=True),
        Binding("left", "scrub(-1)", "step -1", priority=True),
        Binding("right", "scrub(1)", "step +1", priority=True),
        Binding("shift+left", "scrub(-10)", "step -10", show=False, priority=True),
        Binding("shift+right", "scrub(10)", "step +10", show=False, priority=True),
        Binding("home", "first", "first step", show=False, priority=True),
        Binding("end", "newest", "newest step", show=False, priority=True),
        Binding("question_mark", "help", "help", priority=True),
    ]

    def __init__(self, run_dir: Path, interval: float = 1.0):
        super().__init__()
        self.watcher = RunWatcher(Path(run_dir), chunk_bytes=2 << 20)
        self.interval = interval
        self.follow = True
        self.cursor: int | None = None  # row of watcher.table shown by every pane
        self.refreshes = 0
        self.log_shown = 0  # watcher.log_count already written to the log widget
        self._catching_up = False  # a quick follow-up refresh is scheduled (initial load)

    def compose(self) -> ComposeResult:
        # Widgets are kept as attributes: queries search the active screen only,
        # and the timer keeps updating these while the help screen is on top.
        self.header_view = Static(id="header")
        self.charts = [Chart(spec, id="chart-" + spec.key.replace("/", "-")) for spec in panes.CHARTS]
        self.eval_view = Static(id="eval-sets")
        self.other_view = Static(id="other")
        self.timing_view = Static(id="timing-view")
        self.placement_view = Static(id="placement-view")
        self.samples_view = Static(id="samples")
        self.log_view = RichLog(id="log", max_lines=2000, wrap=False, auto_scroll=True)
        yield self.header_view
        with TabbedContent(initial="charts"):
            with TabPane("Charts", id="charts"):
                with VerticalScroll():
                    yield Grid(*self.charts, id="chart-grid")
                    yield self.eval_view
                    yield self.other_view
            with TabPane("Timing", id="timing"):
                yield VerticalScroll(self.timing_view)
            with TabPane("Placement", id="placement"):
                yield VerticalScroll(self.placement_view)
            with TabPane("Log & samples", id="logs"):
                yield VerticalScroll(self.samples_view, id="samples-scroll")
                yield self.log_view
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"hflow monitor — {self.watcher.run_dir}"
        self.refresh_data(force=True)
        self.set_interval(self.interval, self.refresh_data)

    # ------------------------------------------------------------------ data

    def refresh_data(self, force: bool = False) -> None:
        """Read what is new and redraw. While a large file is still loading,
        come back almost at once rather than after a full interval."""
        changed = self.watcher.refresh() or force
        self.refreshes += 1
        n = len(self.watcher.table)
        if n == 0:
            self.cursor = None
        elif self.follow or self.cursor is None:
            self.cursor = n - 1
        else:
            self.cursor = min(self.cursor, n - 1)  # rows dropped by a resumed run
        self.update_header()
        if changed:
            self.update_panes()
        if self.watcher.pending() and not self._catching_up:
            self._catching_up = True
            self.set_timer(0.01, self._catch_up)

    def _catch_up(self) -> None:
        self._catching_up = False
        self.refresh_data()

    def update_header(self) -> None:
        self.header_view.update(panes.header(self.watcher, self.cursor, self.follow))

    def update_panes(self) -> None:
        w, row = self.watcher, self.cursor
        for chart in self.charts:
            chart.set_data(w.table, row)
        self.eval_view.update(eval_pane.eval_sets(w.table, row))
        self.other_view.update(panes.other_metrics(w.table, row))
        width = self.timing_view.content_size.width or self.size.width - 4
        self.timing_view.update(panes.timing(w.table, row, max(width, 40)))
        self.placement_view.update(panes.placement(w, row))
        self.samples_view.update(panes.samples(w, row))
        self.append_log()

    def append_log(self) -> None:
        """Write only the train.log lines read since the last call."""
        w, log = self.watcher, self.log_view
        new = min(w.log_count - self.log_shown, len(w.log_lines))
        if new > 0:
            lines = list(w.log_lines)[-new:]
            log.write(panes.log_text(lines), scroll_end=self.follow)
        self.log_shown = w.log_count

    # ------------------------------------------------------------------ actions

    def action_next_pane(self, delta: int = 1) -> None:
        tabs = self.query_one(TabbedContent)
        i = self.PANES.index(tabs.active) if tabs.active in self.PANES else 0
        tabs.active = self.PANES[(i + delta) % len(self.PANES)]

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        if self.follow and len(self.watcher.table):
            self.cursor = len(self.watcher.table) - 1
        self.update_header()
        self.update_panes()

    def _move_to(self, row: int) -> None:
        n = len(self.watcher.table)
        if n == 0:
            return
        self.cursor = max(0, min(row, n - 1))
        self.update_header()
        self.update_panes()

    def action_scrub(self, delta: int) -> None:
        if self.cursor is None:
            return
        self.follow = False
        self._move_to(self.cursor + delta)

    def action_first(self) -> None:
        self.follow = False
        self._move_to(0)

    def action_newest(self) -> None:
        self.follow = True
        self._move_to(len(self.watcher.table) - 1)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self.push_screen(HelpScreen())
