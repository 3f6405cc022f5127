"""Model-written Python in a plain subprocess with per-process limits: `tools.sandbox: none`,
which a recipe must ask for by name (`code_tool.py` logs a warning when it does).

Limits, set in the child before it starts (`resource.setrlimit` in `preexec_fn`): CPU seconds
(RLIMIT_CPU), address space (RLIMIT_AS), size of any file it writes (RLIMIT_FSIZE, which also
caps its output: stdout and stderr go to a file), and a wall-clock timeout after which its
process group is killed. It runs in a fresh temporary folder with `python -I` (no user site, no
PYTHON* variables) and an almost empty environment; where `unshare -rn` works it has no network
(`network_isolated()`).

This is NOT a security boundary: the code runs as the trainer's user, reads and writes every file
that user can (the run directory, the reward's source, site-packages), reads the trainer's
environment through /proc, can signal the trainer, and its children escape the limits (each has
its own; a `setsid` child outlives the call). Use it only for code you trust, or inside a
machine that is itself the sandbox (a throw-away container or VM).
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

from hflow.engine.rollout.sandbox import Limits, Outcome


@functools.cache
def network_isolated() -> bool:
    """Whether `unshare -rn` (a new user and network namespace: no network) works on this machine."""
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limits(limits: Limits):
    cpu = max(1, int(limits.cpu_s))

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb << 20, limits.memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.output_bytes, limits.output_bytes))
    return apply


def run_unsandboxed(code: str, limits: Limits) -> Outcome:
    """Run `code` in a subprocess with `limits` applied to it alone (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="hflow-code-") as work:
        Path(work, "main.py").write_text(code)
        out_path = Path(work, "output.txt")
        command = [sys.executable, "-I", "main.py"]
        if network_isolated():
            command = ["unshare", "-rn", *command]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(command, cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True, preexec_fn=_limits(limits))
            try:
                code_ = proc.wait(timeout=limits.timeout_s)
                ending = "" if code_ == 0 else _ending(code_, limits.cpu_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                ending = f"error: timed out after {limits.timeout_s:g} s (wall clock)"
        output = out_path.read_bytes()[:limits.output_bytes]
    return Outcome(output, ending)


def _ending(returncode: int, cpu_s: float) -> str:
    if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
        return f"error: killed (CPU time limit of {cpu_s:g} s, or killed)"
    if returncode == -signal.SIGXFSZ:
        return "error: killed (output limit)"
    if returncode < 0:
        return f"error: killed by signal {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"
