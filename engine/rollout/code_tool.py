"""A code-execution tool: model-written Python run in a sandbox, with limits, its output as text.

    from hflow.engine.rollout.code_tool import python_tool
    class MyEnv(ToolEnv):
        tools = [python_tool]

`run_python(code)` runs through the sandbox this process was configured with (`configure`, which
the actor calls with the recipe's `tools.sandbox` and `tools.sandbox_url`):

- `bwrap` (the default): bubblewrap on this machine (`sandbox.py`: its own filesystem view, no
  network, its own PID namespace, limits over the whole process tree, nothing left running).
  Without bwrap a call raises `SandboxUnavailable` (one line: install bubblewrap); it never falls
  back to running the code unsandboxed. `check` says so at start-up, before training.
- `http`: a SandboxFusion server at `tools.sandbox_url` (`sandbox_http.py`), for clusters.
- `none`: a plain subprocess with per-process rlimits only (`unsandboxed.py`): the code can read
  and write what the trainer can. Only by the recipe's explicit choice, logged as a warning.

An environment whose tools run code says so: a tool function marked `runs_code` (as
`python_tool` is), or `runs_code = True` on the class when its `step` or `score` calls
`run_python` itself. The start-up check (`trainer/control/inputs.py`) asks `env_runs_code`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from hflow.engine.rollout import sandbox, sandbox_http, unsandboxed
from hflow.engine.rollout.sandbox import Limits, SandboxUnavailable
from hflow.engine.rollout.tools import truncate

SANDBOXES = ("bwrap", "http", "none")
log = logging.getLogger("hflow.sandbox")


@dataclass(frozen=True)
class SandboxSettings:
    """Which sandbox runs model-written code: `kind` one of SANDBOXES; `url` the server's, for http."""

    kind: str = "bwrap"
    url: str | None = None


_settings = SandboxSettings()


def configure(settings: SandboxSettings) -> None:
    """The sandbox this process's `run_python` uses from now on (the actor sets the recipe's)."""
    global _settings
    if settings.kind not in SANDBOXES:
        raise ValueError(f"sandbox kind {settings.kind!r}: one of {', '.join(SANDBOXES)}")
    if settings.kind == "http" and not settings.url:
        raise ValueError("the http sandbox needs a server URL")
    if settings.kind == "none" and _settings.kind != "none":
        log.warning(UNSANDBOXED_WARNING)
    _settings = settings


def current() -> SandboxSettings:
    return _settings


UNSANDBOXED_WARNING = ("tools.sandbox: none: model-written code runs WITHOUT a sandbox, as your user, able to "
                       "read and write your files, reach the network and signal the trainer")


def check(settings: SandboxSettings) -> str | None:
    """Why model-written code could not run under `settings` on this machine (one line, naming the
    recipe key and the fix), or None. The http server is not called: it may start after the trainer."""
    problem = sandbox.problem() if settings.kind == "bwrap" else None
    return problem and unavailable_message(settings, problem)


def unavailable_message(settings: SandboxSettings, problem: str) -> str:
    if settings.kind == "http":
        return f"tools.sandbox_url {settings.url!r}: {problem}"
    return (f"tools.sandbox {settings.kind}: model-written code runs only in a sandbox, and {problem} (or, "
            "where this machine is itself a throw-away sandbox, set tools.sandbox: none)")


def runs_code(fn: Callable) -> Callable:
    """Mark a tool function as one that runs model-written code (so the start-up check applies)."""
    fn.runs_code = True
    return fn


def env_runs_code(env_cls: type) -> bool:
    """Whether an environment class runs model-written code: `runs_code = True`, or a tool so marked."""
    tools = getattr(env_cls, "tools", None) or []
    return bool(getattr(env_cls, "runs_code", False)) or any(getattr(t, "runs_code", False) for t in tools)


def run_python(code: str, timeout_s: float = 10.0, cpu_s: float = 5.0, memory_mb: int = 1024,
               max_output_chars: int = 4096, processes: int = 32, disk_mb: int = 64,
               settings: SandboxSettings | None = None) -> str:
    """Run `code`; its stdout and stderr (truncated to `max_output_chars`), then how it ended when
    not normally ("exit code 1", "error: timed out after 10 s (wall clock)", "error: killed: ...").
    CPU seconds and memory are of all its processes together; `settings`: the configured ones."""
    s = settings or _settings
    limits = Limits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, processes=processes, disk_mb=disk_mb,
                    output_bytes=max(max_output_chars * 4, 1 << 16))
    try:
        if s.kind == "bwrap":
            outcome = sandbox.run_sandboxed(code, limits)
        elif s.kind == "http":
            outcome = sandbox_http.run_remote(code, limits, s.url)
        else:
            outcome = unsandboxed.run_unsandboxed(code, limits)
    except SandboxUnavailable as err:
        raise type(err)(unavailable_message(s, str(err))) from None
    text = truncate(outcome.output[:max_output_chars * 4 + 1].decode("utf-8", "replace"), max_output_chars)
    return f"{text}\n{outcome.ending}".strip() if outcome.ending else text


@runs_code
def python_tool(code: str) -> str:
    """Run a Python program and return what it prints (stdout and stderr).

    code: the program's source; print what you want to see
    """
    return run_python(code)
