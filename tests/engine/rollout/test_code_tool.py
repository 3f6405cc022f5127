"""The code tool: output comes back, and a program that loops, floods or allocates is stopped by
its limits with an error line, never a hung or crashed run."""

import pytest

from hflow.engine.rollout.code_tool import network_isolated, python_tool, run_python
from hflow.engine.rollout.tools import tool_spec


def test_output_and_errors_come_back():
    assert run_python("print(6 * 7)") == "42\n"
    out = run_python("raise ValueError('no')")
    assert "ValueError: no" in out and out.endswith("exit code 1")
    assert tool_spec(python_tool)["function"]["parameters"]["required"] == ["code"]


def test_a_busy_loop_is_stopped_by_the_cpu_limit_or_the_wall_clock():
    out = run_python("while True: pass", timeout_s=3, cpu_s=1)
    assert out.startswith("error: killed") or out.startswith("error: timed out"), out


def test_a_sleeping_program_is_killed_at_the_wall_clock_timeout():
    assert run_python("import time; time.sleep(30)", timeout_s=1) == "error: timed out after 1 s (wall clock)"


def test_ten_megabytes_of_output_are_cut():
    out = run_python("print('x' * (10 << 20))", max_output_chars=1000)
    assert out.startswith("x" * 1000) and len(out) < 1200 and "truncated" in out


@pytest.mark.parametrize("code", ["b = bytearray(4 << 30)"])
def test_a_memory_hog_fails_inside_its_limit(code):
    out = run_python(code, memory_mb=256)
    assert "MemoryError" in out


@pytest.mark.skipif(not network_isolated(), reason="unshare -rn does not work on this machine")
def test_where_unshare_works_the_program_has_no_network():
    out = run_python("import socket; print([name for _, name in socket.if_nameindex()])")
    assert out.strip() == "['lo']"  # a fresh network namespace: the loopback alone, down
