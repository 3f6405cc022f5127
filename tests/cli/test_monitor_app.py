"""`hflow monitor` driven through Textual's pilot on recorded run directories."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fake_runs import event
from hflow.cli.monitor.app import HelpScreen, MonitorApp
from hflow.cli.monitor.charts import Chart
from textual.widgets import RichLog, Static, TabbedContent

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "safe-rlhf-demo"
SIZE = (120, 50)


def text_of(app: MonitorApp, selector: str) -> str:
    """Plain text of a Static's current content."""
    content = app.query_one(selector, Static).content
    return content.plain if hasattr(content, "plain") else str(content)


def cells(table, i: int) -> list:
    """Cells of column ``i`` of a rich Table."""
    return list(table.columns[i].cells)


def chart(app: MonitorApp, key: str) -> Chart:
    return app.query_one("#chart-" + key.replace("/", "-"), Chart)


async def wait_for(pilot, condition, timeout: float = 10.0) -> None:
    """Let the app's timer run until ``condition()`` holds (the monitor polls files)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        assert loop.time() < end, "condition not reached"
        await pilot.pause(0.05)


def run_app(run_dir: Path, body, interval: float = 0.05) -> None:
    async def main():
        app = MonitorApp(run_dir, interval=interval)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await body(app, pilot)

    asyncio.run(main())


def test_header_charts_and_stage_bars_show_recorded_values(run_factory):
    run = run_factory(steps=5, total_steps=10)

    async def body(app, pilot):
        header = text_of(app, "#header")
        assert "ppo-tiny" in header and "ppo" in header and "tiny-llama" in header
        assert "running" in header and "step 5 of 10" in header and "ETA" in header

        reward = chart(app, "reward/mean")
        assert reward.display and reward.series.line.tolist() == [0.1 * s for s in range(1, 6)]
        assert reward.series.lo.tolist()[-1] == 0.5 - 0.2  # band from reward/min .. reward/max
        assert reward.border_subtitle == "step 5: 0.5 [0.3 … 0.7]"
        drawn = reward.render().plain
        assert "0.7┤" in drawn and any(0x2800 < ord(c) <= 0x28FF for c in drawn)
        assert chart(app, "critic/loss").display  # PPO
        assert not chart(app, "cost/mean").display  # no Safe-RLHF keys in this run

        other = app.query_one("#other", Static).content
        assert "actor/grad_norm" in [c for c in cells(other, 0)]

        timing = text_of(app, "#timing-view")
        assert "step 5   total 2.850s" in timing
        for i, stage in enumerate(["generate", "reference", "values", "reward", "advantage", "update_critic"]):
            assert stage in timing and f"{(i + 1) / 10:.3f}s" in timing

    run_app(run, body)


def test_keys_switch_panes_scrub_follow_and_help(run_factory):
    run = run_factory(steps=5)

    async def body(app, pilot):
        tabs = app.query_one(TabbedContent)
        assert tabs.active == "charts"
        await pilot.press("tab")
        assert tabs.active == "timing"
        await pilot.press("tab", "tab")
        assert tabs.active == "logs"
        await pilot.press("tab")
        assert tabs.active == "charts"
        await pilot.press("shift+tab")
        assert tabs.active == "logs"

        assert app.cursor == 4 and app.follow
        await pilot.press("left", "left")
        assert app.cursor == 2 and not app.follow
        assert "viewing step 3" in text_of(app, "#header")
        assert chart(app, "reward/mean").border_subtitle.startswith("step 3: 0.3")
        assert "step 3" in text_of(app, "#timing-view")
        assert "prompt 3.0" in str(cells(app.query_one("#samples", Static).content, 0)[0])
        await pilot.press("right")
        assert app.cursor == 3
        await pilot.press("shift+left")
        assert app.cursor == 0  # clamped at the first step
        await pilot.press("f")
        assert app.follow and app.cursor == 4

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    run_app(run, body)


def test_appended_event_appears_without_restart(run_factory, event_line):
    run = run_factory(steps=5, total_steps=10)

    async def body(app, pilot):
        assert "step 5 of 10" in text_of(app, "#header")
        with open(run / "events.jsonl", "a") as f:
            f.write(event_line(6))
        with open(run / "train.log", "a") as f:
            f.write("INFO step 6 done\n")
        await wait_for(pilot, lambda: len(app.watcher.table) == 6)
        await pilot.pause()
        assert "step 6 of 10" in text_of(app, "#header")
        assert chart(app, "reward/mean").series.line[-1] == pytest.approx(0.6)
        assert chart(app, "reward/mean").border_subtitle.startswith("step 6: 0.6")
        await wait_for(pilot, lambda: app.log_shown == 6)
        await pilot.press("shift+tab")  # the log pane; RichLog lays lines out once visible
        await pilot.pause()
        log = app.query_one("#log", RichLog)
        assert "INFO step 6 done" in "\n".join(strip.text for strip in log.lines)

        # follow off: data still arrives, the cursor stays where the user put it
        await pilot.press("left")
        with open(run / "events.jsonl", "a") as f:
            f.write(event_line(7))
        await wait_for(pilot, lambda: len(app.watcher.table) == 7)
        assert app.cursor == 4 and chart(app, "reward/mean").series.line[-1] == pytest.approx(0.7)

    run_app(run, body)


def test_truncated_last_line_renders_and_completes_later(run_factory, event_line):
    run = run_factory(steps=3)
    full = event_line(4)
    with open(run / "events.jsonl", "a") as f:
        f.write(full[:25])

    async def body(app, pilot):
        assert len(app.watcher.table) == 3 and app.watcher.events.bad_lines == 0
        assert "step 3 of 10" in text_of(app, "#header")
        with open(run / "events.jsonl", "a") as f:
            f.write(full[25:])
        await wait_for(pilot, lambda: len(app.watcher.table) == 4)
        assert app.watcher.table.steps[-1] == 4 and app.watcher.events.bad_lines == 0

    run_app(run, body)


def test_run_with_no_events_yet_renders(run_factory, event_line):
    run = run_factory(steps=0, plan=False, samples=False)
    (run / "events.jsonl").unlink()

    async def body(app, pilot):
        assert app.cursor is None
        assert "step 0 of 10" in text_of(app, "#header") and "running" in text_of(app, "#header")
        assert not any(c.display for c in app.query(Chart))
        assert "no timing" in text_of(app, "#timing-view")
        await pilot.press("left", "right", "f", "tab", "tab")
        assert "no plan.json" in str(app.query_one("#placement-view", Static).content.renderables[0])
        (run / "events.jsonl").write_text(event_line(1))  # the first step arrives
        await wait_for(pilot, lambda: app.cursor == 0)
        assert chart(app, "reward/mean").display

    run_app(run, body)


def test_shipped_safe_rlhf_fixture_placement_and_samples():
    """The recorded run under tests/fixtures: Safe-RLHF charts, placement with per-rank memory, samples."""

    async def body(app, pilot):
        header = text_of(app, "#header")
        assert "safe-rlhf-demo" in header and "finished" in header and "step 60 of 60" in header
        assert "ETA" not in header
        assert chart(app, "cost/mean").display and chart(app, "lagrange/lambda").display
        assert not chart(app, "critic/loss").display
        assert chart(app, "lagrange/lambda").series.line[-1] == pytest.approx(0.6)

        await pilot.press("tab", "tab")
        assert app.query_one(TabbedContent).active == "placement"
        group = app.query_one("#placement-view", Static).content
        pools, roles, memory = group.renderables
        assert cells(pools, 0) == ["pool0", "pool1"] and cells(pools, 1)[0] == "cuda:0, cuda:1"
        assert cells(roles, 0) == ["actor", "reference", "critic", "reward"]
        assert cells(memory, 2) == ["", "cuda:0", "cuda:1"]  # per-rank rows carry their device
        assert cells(memory, 3)[1:] == ["3.0 GiB", "2.0 GiB"]

        await pilot.press("tab")
        samples = app.query_one("#samples", Static).content
        assert cells(samples, 0) == ["prompt 60.0", "prompt 60.1"] and cells(samples, 2) == ["60", "60.1"]
        log = "\n".join(strip.text for strip in app.query_one("#log", RichLog).lines)
        assert "INFO training finished" in log

    run_app(FIXTURE, body)


def test_tool_use_and_async_runs_get_their_charts(run_factory):
    """episode/* (rollout.env) and async/* (trainer.mode async) keys have charts; a run without them does not."""
    plain = run_factory(steps=3, name="plain")
    run = run_factory(steps=0, name="tools-async")
    with open(run / "events.jsonl", "a") as f:
        for step in (1, 2, 3):
            f.write(json.dumps({**event(step, "grpo"), "episode/tool_call_share": 0.25 * step, "episode/turns_mean": 1.5,
                                "async/staleness_mean": 0.5, "async/staleness_max": 1.0,
                                "async/queue_depth": 1.0}) + "\n")

    async def body(app, pilot):
        await wait_for(pilot, lambda: chart(app, "episode/tool_call_share").display)
        assert chart(app, "episode/tool_call_share").series.line.tolist() == [0.25, 0.5, 0.75]
        staleness = chart(app, "async/staleness_mean")
        assert staleness.display and staleness.series.hi.tolist() == [1.0, 1.0, 1.0]
        assert chart(app, "async/queue_depth").display and chart(app, "episode/turns_mean").display

    async def without(app, pilot):
        assert not chart(app, "episode/tool_call_share").display and not chart(app, "async/staleness_mean").display

    run_app(run, body)
    run_app(plain, without)


def test_a_multi_turn_sample_shows_its_episode_turn_by_turn(run_factory):
    """samples.jsonl's `episode` (rollout.env runs): each turn's text, the tool's answer, rewards, the end."""
    run = run_factory(steps=2, samples=False)
    episode = {"turns": [{"assistant": "<tool_call>47 * 86</tool_call>", "reward": 0.0, "tokens": 9,
                          "observation": [{"role": "tool", "content": "4042"}]},
                         {"assistant": "4042", "observation": [], "reward": 1.0, "tokens": 3}],
               "ended": "done", "return": 1.0, "tool_calls": 1}
    (run / "samples.jsonl").write_text(json.dumps({"step": 2, "prompt": "What is 47 * 86?", "response": "x",
                                                   "reward": 1.0, "episode": episode}) + "\n")

    async def body(app, pilot):
        await pilot.press("tab", "tab", "tab")
        shown = cells(app.query_one("#samples", Static).content, 1)[0].plain
        assert shown.splitlines() == ["turn 1 assistant: <tool_call>47 * 86</tool_call>", "  tool: 4042",
                                      "turn 2 assistant: 4042", "  reward 1", "ended done, return 1, 1 tool call"]

    run_app(run, body)


def test_100k_step_run_loads_and_scrubs(tmp_path):
    run = tmp_path / "long"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"name": "long", "status": "finished", "step": 100_000,
                                                 "total_steps": 100_000}))
    line = '{"step": %d, "reward/mean": %d.5, "kl/mean": 0.01, "timing/generate": 0.5}\n'
    with open(run / "events.jsonl", "w") as f:
        f.write("".join(line % (s, s % 10) for s in range(1, 100_001)))

    async def body(app, pilot):
        await wait_for(pilot, lambda: len(app.watcher.table) == 100_000 and app.cursor == 99_999, timeout=30)
        await pilot.pause()
        reward = chart(app, "reward/mean")
        assert reward.border_subtitle == "step 100000: 0.5"  # 100000 % 10 = 0
        assert len(reward.render().plain.splitlines()) == reward.content_size.height
        await pilot.press("left")
        assert reward.border_subtitle == "step 99999: 9.5"
        before = app.watcher.events.bytes_read
        with open(run / "events.jsonl", "a") as f:
            f.write(line % (100_001, 1))
        await wait_for(pilot, lambda: len(app.watcher.table) == 100_001)
        assert app.watcher.events.bytes_read - before == len(line % (100_001, 1))

    run_app(run, body, interval=0.1)
