"""The code tool: output comes back, and a program that loops, floods or allocates is stopped by
its limits with an error line, never a hung or crashed run; it runs in the configured sandbox
(bwrap by default), and a sandbox that cannot run stops the run instead of running the code
without one. The hostile programs are in test_sandbox.py."""

import logging

import pytest

from hflow.engine.rollout import code_tool, sandbox
from hflow.engine.rollout.code_tool import SandboxSettings, env_runs_code, python_tool, run_python
from hflow.engine.rollout.tools import ToolCall, ToolEnv, ToolRunner, tool_spec
from hflow.errors import UserError

UNSANDBOXED = SandboxSettings("none")


def test_the_default_sandbox_is_bwrap():
    assert SandboxSettings().kind == "bwrap"


@pytest.mark.usefixtures("bwrap")
def test_output_and_errors_come_back():
    assert run_python("print(6 * 7)") == "42\n"
    out = run_python("raise ValueError('no')")
    assert "ValueError: no" in out and out.endswith("exit code 1")
    assert tool_spec(python_tool)["function"]["parameters"]["required"] == ["code"]


@pytest.mark.usefixtures("bwrap")
def test_a_busy_loop_is_stopped_by_the_cpu_limit():
    out = run_python("while True: pass", timeout_s=30, cpu_s=1)
    assert out.startswith("error: killed") and "CPU time limit of 1 s" in out, out


@pytest.mark.usefixtures("bwrap")
def test_a_sleeping_program_is_killed_at_the_wall_clock_timeout():
    assert run_python("import time; time.sleep(30)", timeout_s=1) == "error: timed out after 1 s (wall clock)"


@pytest.mark.usefixtures("bwrap")
def test_ten_megabytes_of_output_are_cut():
    out = run_python("print('x' * (10 << 20))", max_output_chars=1000)
    assert out.startswith("x" * 1000) and len(out) < 1200 and "truncated" in out
    assert out.endswith("error: killed: output limit of 65536 bytes"), out[-200:]


@pytest.mark.usefixtures("bwrap")
def test_a_memory_hog_fails_inside_its_limit():
    assert "MemoryError" in run_python("b = bytearray(4 << 30)", memory_mb=256)


def test_without_bwrap_a_call_stops_the_run_rather_than_run_unsandboxed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        run_python("print('should not run')")
    line = str(err.value)
    assert line.startswith("tools.sandbox bwrap: ") and "install bubblewrap" in line and "\n" not in line
    assert code_tool.check(SandboxSettings("bwrap")) == line
    # through a tool environment the run stops too: it is no observation for the model to learn from
    runner = ToolRunner([python_tool], timeout_s=30)
    with pytest.raises(UserError, match="install bubblewrap"):
        runner.call(ToolCall("python_tool", {"code": "print(1)"}))


def test_an_environment_says_whether_it_runs_code():
    class WithTool(ToolEnv):
        tools = [python_tool]

    class Scorer:  # runs the model's answer in its score, not through a tool
        runs_code = True

    class Calculator(ToolEnv):
        tools = [len]

    assert env_runs_code(WithTool) and env_runs_code(Scorer) and not env_runs_code(Calculator)


def test_opting_out_is_logged_as_a_warning(caplog):
    try:
        with caplog.at_level(logging.WARNING, logger="hflow.sandbox"):
            code_tool.configure(UNSANDBOXED)
        assert "WITHOUT a sandbox" in caplog.text
        assert code_tool.current() == UNSANDBOXED
    finally:
        code_tool.configure(SandboxSettings())
    with pytest.raises(ValueError, match="needs a server URL"):
        code_tool.configure(SandboxSettings("http"))


def test_the_unsandboxed_subprocess_still_has_its_limits():
    # benign programs only: `none` runs the code as this user, with nothing between it and the machine
    assert run_python("print(6 * 7)", settings=UNSANDBOXED) == "42\n"
    assert run_python("import time; time.sleep(30)", timeout_s=1,
                      settings=UNSANDBOXED) == "error: timed out after 1 s (wall clock)"
    assert "MemoryError" in run_python("b = bytearray(4 << 30)", memory_mb=256, settings=UNSANDBOXED)
