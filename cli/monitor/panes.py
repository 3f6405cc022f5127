"""What the monitor's panes show, as pure functions of a ``RunWatcher`` and a cursor row.

Each function returns a rich renderable; the app only decides where it goes.
Keeping them pure makes every pane testable without a terminal.
"""

from __future__ import annotations

import math
import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from hflow.cli.monitor.charts import ChartSpec, fmt_num
from hflow.trainer.rundir.metrics import MetricTable, iter_memory_keys
from hflow.trainer.rundir.watcher import RunWatcher

STATUS_STYLE = {"running": "bold green", "finished": "bold blue", "failed": "bold red"}

# The charts pane, in order. A chart whose key never appears stays hidden
# (Safe-RLHF's cost and lambda, PPO's critic loss).
CHARTS = [
    ChartSpec("reward", "reward/mean", band=("reward/min", "reward/max"), std="reward/std", color="green"),
    ChartSpec("eval accuracy (held out)", "eval/accuracy", color="bright_green"),
    ChartSpec("eval reward (held out)", "eval/reward", color="green"),
    ChartSpec("KL", "kl/mean", color="magenta"),
    ChartSpec("entropy", "entropy/mean", color="yellow"),
    ChartSpec("response length", "response_length/mean", color="cyan"),
    ChartSpec("actor loss", "actor/loss", color="red"),
    ChartSpec("critic loss", "critic/loss", color="red"),
    ChartSpec("throughput tokens/s", "throughput/tokens_per_s", color="blue"),
    ChartSpec("cost", "cost/mean", color="bright_red"),
    ChartSpec("lagrange lambda", "lagrange/lambda", color="bright_magenta"),
    ChartSpec("tool-call share (episodes)", "episode/tool_call_share", color="bright_cyan"),  # rollout.env
    ChartSpec("episode turns", "episode/turns_mean", color="cyan"),
    ChartSpec("staleness (async)", "async/staleness_mean", band=("async/staleness_mean", "async/staleness_max"),
              color="bright_yellow"),  # trainer.mode async: policy versions behind, mean [.. max]
    ChartSpec("rollout queue depth (async)", "async/queue_depth", color="yellow"),
]
# Keys shown elsewhere (charts, bands, timing, memory), so not in "other metrics".
_SHOWN = {s.key for s in CHARTS} | {"reward/min", "reward/max", "reward/std", "async/staleness_max"}
STAGE_COLORS = ["cyan", "green", "yellow", "magenta", "blue", "red", "bright_cyan", "bright_green", "bright_yellow"]
_EIGHTHS = " ▏▎▍▌▋▊▉█"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def fmt_bytes(n: float) -> str:
    if not math.isfinite(n):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def eta_seconds(table: MetricTable, step: int, total: int) -> float | None:
    """Seconds left, from the pace of the last (up to) 50 steps' timestamps."""
    if not total or step >= total or len(table) < 2:
        return None
    k = min(len(table), 50)
    t0, t1 = table.times[-k], table.times[-1]
    s0, s1 = table.steps[-k], table.steps[-1]
    if not (math.isfinite(t0) and math.isfinite(t1)) or s1 <= s0:
        return None
    return (t1 - t0) / (s1 - s0) * (total - step)


def header(w: RunWatcher, cursor: int | None, follow: bool, now: float | None = None) -> Text:
    """Two lines: who/what/status, then progress, elapsed, ETA and the cursor."""
    st, table = w.status, w.table
    now = time.time() if now is None else now
    step = max(st.step, table.steps[-1] if len(table) else 0)
    total = st.total_steps
    t = Text()
    t.append(st.name, "bold")
    t.append(f"  {st.algorithm}  {st.model}  ")
    t.append(st.status + (" (crashed)" if st.crashed else ""), STATUS_STYLE.get(st.status, "bold"))
    if st.error and st.status == "failed":
        t.append(f"  {st.error.splitlines()[0][:100]}", "red")
    t.append("\n")
    t.append(f"step {step} of {total or '?'}")
    if total:
        done = min(step / total, 1.0)
        t.append(f"  {'█' * int(done * 20)}{'░' * (20 - int(done * 20))} {done:.0%}")
    end = now if st.status == "running" else (st.updated or now)
    elapsed = end - st.started if st.started else None
    t.append(f"   elapsed {fmt_duration(elapsed)}")
    if st.status == "running":
        t.append(f"   ETA {fmt_duration(eta_seconds(table, step, total))}")
    if len(table) and cursor is not None:
        t.append(f"   viewing step {table.steps[cursor]}", "bold" if not follow else "")
    t.append("   follow" if follow else "   follow off (f)", "green" if follow else "yellow")
    if w.events.bad_lines:
        t.append(f"   {w.events.bad_lines} unreadable event line(s)", "yellow")
    return t


def _bar(value: float, scale: float, width: int, style: str) -> Text:
    """A horizontal bar in eighths of a cell."""
    if not (math.isfinite(value) and scale > 0):
        return Text(" " * width)
    eighths = int(round(max(value, 0) / scale * width * 8))
    full, rest = divmod(min(eighths, width * 8), 8)
    return Text("█" * full + (_EIGHTHS[rest] if rest else ""), style).append(" " * (width - full - (1 if rest else 0)))


def stage_times(table: MetricTable, row: int) -> list[tuple[str, float, float]]:
    """(stage, seconds at ``row``, mean seconds over the run) per ``timing/<stage>`` key except step."""
    out = []
    for key in table.keys("timing/"):
        if key == "timing/step":
            continue
        out.append((key.split("/", 1)[1], table.value(key, row), table.stats(key)[0]))
    return out


def stacked_bar(parts: list[tuple[str, float]], width: int) -> Text:
    """One bar, one coloured segment per stage, proportional to its seconds."""
    total = sum(v for _, v in parts if math.isfinite(v))
    t = Text()
    if total <= 0:
        return t
    used = 0
    for i, (_, v) in enumerate(parts):
        if not math.isfinite(v):
            continue
        cells = int(round(v / total * width))
        cells = min(cells, width - used)
        t.append("█" * cells, STAGE_COLORS[i % len(STAGE_COLORS)])
        used += cells
    return t


def timing(table: MetricTable, row: int | None, width: int = 80) -> Group | Text:
    """Time per stage of the step at ``row`` and on average, as bars."""
    if row is None or not table.keys("timing/"):
        return Text("no timing/<stage> keys in events.jsonl yet", style="dim")
    stages = stage_times(table, row)
    step_t = table.value("timing/step", row)
    name_w = max([len(s) for s, _, _ in stages] + [5]) + 1
    bar_w = max(width - name_w - 34, 10)
    scale = max([v for _, a, m in stages for v in (a, m) if math.isfinite(v)] + [0])
    lines = Text()
    lines.append(f"step {table.steps[row]}" + (f"   total {step_t:.3f}s" if math.isfinite(step_t) else ""), "bold")
    stage_sum = sum(a for _, a, _ in stages if math.isfinite(a))
    if math.isfinite(step_t) and step_t > stage_sum:
        lines.append(f"   (other {step_t - stage_sum:.3f}s)", "dim")
    lines.append("\n")
    for i, (name, at, mean) in enumerate(stages):
        color = STAGE_COLORS[i % len(STAGE_COLORS)]
        share = at / stage_sum if stage_sum and math.isfinite(at) else math.nan
        lines.append(name.ljust(name_w), color)
        lines.append_text(_bar(at, scale, bar_w, color))
        lines.append(f" {at:8.3f}s {share:5.0%}" if math.isfinite(at) else "        –      ")
        lines.append(f"   avg {mean:8.3f}s\n" if math.isfinite(mean) else "   avg –\n", "dim")
    lines.append("\nthis step  ", "bold")
    lines.append_text(stacked_bar([(n, a) for n, a, _ in stages], bar_w + name_w))
    lines.append("\naverage    ", "bold")
    lines.append_text(stacked_bar([(n, m) for n, _, m in stages], bar_w + name_w))
    return lines


def placement(w: RunWatcher, row: int | None) -> Group:
    """Pools, the roles and devices on each, and per-rank peak memory."""
    parts = []
    plan = w.plan
    if plan is None:
        parts.append(Text("no plan.json in this run: placement unknown", style="dim"))
    else:
        pools = Table(title=f"pools (backend: {plan.backend})", title_justify="left", expand=False)
        for col in ("pool", "devices", "roles"):
            pools.add_column(col)
        for p in plan.pools:
            pools.add_row(p.name, ", ".join(p.devices), ", ".join(p.roles))
        roles = Table(title="roles", title_justify="left")
        for col in ("role", "pool", "ranks", "devices"):
            roles.add_column(col)
        for role, info in plan.roles.items():
            ranks = [r for r in info.get("ranks", []) if isinstance(r, int)]
            devs = [plan.device(role, r) or "?" for r in ranks]
            roles.add_row(role, str(info.get("pool", "?")), ", ".join(map(str, ranks)), ", ".join(devs))
        parts += [pools, roles]
    parts.append(memory(w, row))
    return Group(*parts)


def memory(w: RunWatcher, row: int | None) -> Table | Text:
    table = w.table
    keys = list(iter_memory_keys(table.keys("memory/")))
    overall = table.column("memory/peak_bytes") is not None
    if row is None or not (keys or overall):
        return Text("no memory/… keys in events.jsonl yet", style="dim")
    mem = Table(title=f"peak memory (step {table.steps[row]})", title_justify="left")
    for col in ("role", "rank", "device", "this step", "max over run"):
        mem.add_column(col, justify="right" if col in ("rank", "this step", "max over run") else "left")
    if overall:
        peak = table.stats("memory/peak_bytes")[1]
        mem.add_row("all", "", "", fmt_bytes(table.value("memory/peak_bytes", row)), fmt_bytes(peak))
    for role, rank, key in sorted(keys):
        device = (w.plan.device(role, rank) if w.plan else None) or "?"
        mem.add_row(role, str(rank), device, fmt_bytes(table.value(key, row)), fmt_bytes(table.stats(key)[1]))
    return mem


def other_metrics(table: MetricTable, row: int | None) -> Table | Text:
    """Every numeric key without a chart, timing, memory or held-out-set view (grad norm, lr, unknown
    keys; eval/*: `eval_pane.py`); not the work account's counters (`work/*`: `hflow bench step` reads them)."""
    if row is None:
        return Text("")
    keys = [k for k in table.keys() if k not in _SHOWN and not k.startswith(("timing/", "memory/", "work/", "eval/"))]
    if not keys and not table.text:
        return Text("")
    t = Table(title=f"other metrics (step {table.steps[row]})", title_justify="left", box=None)
    t.add_column("key", style="bold")
    t.add_column("value", justify="right")
    t.add_column("latest", justify="right", style="dim")
    for k in keys:
        t.add_row(k, fmt_num(table.value(k, row)), fmt_num(table.value(k, len(table) - 1)))
    for k, v in table.text.items():
        t.add_row(k, "", str(v)[:60])
    return t


def samples(w: RunWatcher, row: int | None) -> Table | Text:
    """Generations recorded at the cursor step (or the closest earlier step with some)."""
    if not w.samples:
        return Text("no samples.jsonl in this run", style="dim")
    step = w.table.steps[row] if row is not None and len(w.table) else w.samples[-1].get("step", 0)
    rows = w.samples_at(step)
    if not rows:
        return Text(f"no samples at or before step {step}", style="dim")
    t = Table(title=f"samples (step {rows[0].get('step')})", title_justify="left", expand=True, show_lines=True)
    t.add_column("prompt", ratio=2)
    t.add_column("response", ratio=3)
    t.add_column("reward", justify="right", width=8)
    for s in rows:
        reward = s.get("reward")
        response = episode_text(s["episode"]) if isinstance(s.get("episode"), dict) else str(s.get("response", ""))
        t.add_row(str(s.get("prompt", "")), response, fmt_num(reward) if isinstance(reward, (int, float)) else "–")
    return t


def episode_text(episode: dict) -> Text:
    """A multi-turn episode (samples.jsonl's `episode`), turn by turn: what the model wrote, what
    the environment answered, the turn's reward; then how it ended."""
    out = Text()
    for k, turn in enumerate(episode.get("turns", []), 1):
        out.append(f"turn {k} ", style="bold")
        out.append(f"assistant: {turn.get('assistant', '')}\n")
        for message in turn.get("observation", []):
            out.append(f"  {message.get('role', '?')}: {message.get('content', '')}\n", style="cyan")
        if turn.get("reward"):
            out.append(f"  reward {fmt_num(turn['reward'])}\n", style="green")
    calls = episode.get("tool_calls")
    out.append(f"ended {episode.get('ended', '?')}, return {fmt_num(episode.get('return', 0.0))}"
               + (f", {calls} tool call{'s' * (calls != 1)}" if calls is not None else ""), style="dim")
    return out


def log_text(lines: list[str]) -> Text:
    """train.log lines, errors in red and warnings in yellow."""
    out = Text()
    for i, line in enumerate(lines):
        style = "red" if ("ERROR" in line or "Traceback" in line) else ("yellow" if "WARN" in line else "")
        out.append(line + ("\n" if i < len(lines) - 1 else ""), style)
    return out
