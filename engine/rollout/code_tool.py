"""A code-execution tool: run model-written Python in a subprocess with resource limits.

    from hflow.engine.rollout.code_tool import python_tool
    class MyEnv(ToolEnv):
        tools = [python_tool]

Limits, set in the child before it starts (`resource.setrlimit` in `preexec_fn`): CPU seconds
(RLIMIT_CPU), address space (RLIMIT_AS), size of any file it writes (RLIMIT_FSIZE, which also
caps its output: stdout and stderr go to files), and a wall-clock timeout after which its whole
process group is killed. It runs in a fresh temporary directory with `python -I` (no user site,
no PYTHON* variables) and an almost empty environment. Where `unshare -rn` works (a Linux kernel
that lets unprivileged users make namespaces; often not inside containers) it also runs without
network; `network_isolated()` says whether it does here.

This is NOT a security boundary: the code runs as the same user, can read every file that user
can, and without `unshare` can use the network. Run untrusted models' code in a container or VM.
"""

from __future__ import annotations

import functools
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from hflow.engine.rollout.tools import truncate


@functools.cache
def network_isolated() -> bool:
    """Whether `unshare -rn` (a new user and network namespace: no network) works on this machine."""
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limits(cpu_s: int, memory_mb: int, output_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes, output_bytes))
    return apply


def run_python(code: str, timeout_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 1024,
               max_output_chars: int = 4096) -> str:
    """Run `code`; its stdout and stderr (truncated), and how it ended when not normally."""
    with tempfile.TemporaryDirectory(prefix="hflow-code-") as work:
        Path(work, "main.py").write_text(code)
        out_path = Path(work, "output.txt")
        command = [sys.executable, "-I", "main.py"]
        if network_isolated():
            command = ["unshare", "-rn", *command]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(command, cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True,
                                    preexec_fn=_limits(cpu_s, memory_mb, max(max_output_chars * 4, 1 << 16)))
            try:
                code_ = proc.wait(timeout=timeout_s)
                ending = "" if code_ == 0 else _ending(code_, cpu_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                ending = f"error: timed out after {timeout_s:g} s (wall clock)"
        text = out_path.read_bytes()[:max_output_chars * 4 + 1].decode("utf-8", "replace")
    text = truncate(text, max_output_chars)
    return f"{text}\n{ending}".strip() if ending else text


def _ending(returncode: int, cpu_s: int) -> str:
    if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
        return f"error: killed (CPU time limit of {cpu_s} s, or killed)"
    if returncode == -signal.SIGXFSZ:
        return "error: killed (output limit)"
    if returncode < 0:
        return f"error: killed by signal {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def python_tool(code: str) -> str:
    """Run a Python program and return what it prints (stdout and stderr).

    code: the program's source; print what you want to see
    """
    return run_python(code)
