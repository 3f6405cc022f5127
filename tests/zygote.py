"""`hflow train` and `hflow eval` for the tests, each in a process forked from one that has already
imported torch, transformers and deepspeed.

About 8 of every such command's first seconds on a 2-core machine are those imports, the same in
every run; the suite starts well over a hundred of them. A server process per test process
(`Zygote`) imports them once, as the command does (`hflow.cli` first: its thread and host-memory
settings come before torch loads; then the libraries' quiet settings), and forks a child for
each command. The child is the command from its first line of hflow code: its own working folder,
environment, arguments, standard streams (files, read back as `subprocess.run` would return
them), exit code (a signal's as `-signum`), uncaught exceptions through `sys.excepthook`, and
its threads joined and `atexit` run at the end as at any interpreter's exit.

What a fork cannot give the child is a setting read when a library loads: the server was started
with the test session's environment. `eligible` therefore takes a call only when its environment
differs from that one in keys read after start-up (`HFLOW_*` recipe keys, the settings of Ray, vLLM
and wandb, which the server does not import, a process group's rendezvous) or in keys the imports
set themselves, to the same value. Any other difference (threads, host memory, Hugging Face's
settings, Python's path) runs the command in a fresh process, as `TEST_FRESH_PROCESSES=1` does
every command.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

COMMANDS = ("train", "eval")  # the commands that load torch; every other one stops before it does
# Environment keys read after start-up: recipe keys, the test's name, `breakpoint()`'s (read at each
# call), those of the libraries the server does not import (`NOT_PRELOADED`: the child imports them
# and reads their keys then; a test that ran Ray in-process leaves Ray's token and settings), and
# the process group's rendezvous, which torch reads when a group starts.
AFTER_START = ("HFLOW_", "PYTEST_CURRENT_TEST", "PYTHONBREAKPOINT", "WANDB_", "RAY_", "VLLM_")
NOT_PRELOADED = ("wandb", "ray", "vllm")
GROUP_KEYS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME"}
FRESH = "TEST_FRESH_PROCESSES"  # set to 1: every command in a fresh process

# What a `hflow train` imports before its first step (`-X importtime`): the rest is light.
PRELOAD = ("hflow.cli.app", "hflow.trainer.control.session", "hflow.trainer.api.launch",
           "transformers.models.llama.modeling_llama", "deepspeed",
           "deepspeed.runtime.zero.muon.original_muon")

BASE: dict | None = None  # the test session's environment, which conftest sets once it is complete
_SHARED: list = []


def shared() -> "Zygote":
    """This test process's server, started at the first call and ended with the process."""
    if not _SHARED:
        import atexit

        _SHARED.append(Zygote(BASE))
        atexit.register(_SHARED[0].close)
    return _SHARED[0]


def eligible(args: tuple[str, ...], env: dict, base: dict, preloaded: dict) -> bool:
    """Whether `hflow ARGS` with environment `env` runs as it would in a fresh process when forked
    from a server started with environment `base` whose imports left it `preloaded`. Every key
    that differs from `base` must be read after start-up, or hold the value the imports set
    themselves (the command's own settings: a fresh process would have it by then too)."""
    if not _forkable(args, env, base):
        return False
    changed = {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)}
    return all(k.startswith(AFTER_START) or k in GROUP_KEYS or env.get(k) == preloaded.get(k) for k in changed)


def _forkable(args: tuple[str, ...], env: dict, base: dict) -> bool:
    """A command that loads torch, in a session or call that has not asked for fresh processes."""
    return bool(args) and args[0] in COMMANDS and "1" not in (base.get(FRESH), env.get(FRESH))


class Zygote:
    """One server per test process, started at the first call with the environment `base`."""

    def __init__(self, base: dict):
        self.base = dict(base)
        self.proc: subprocess.Popen | None = None
        self.pending = b""  # what the server has written beyond its last whole answer
        self.preloaded: dict = {}  # the server's environment after its imports
        self.files = Path(tempfile.mkdtemp(prefix="hflow-zygote-"))

    def _start(self) -> None:
        with open(self.files / "server.log", "ab") as log:  # what the imports print
            self.proc = subprocess.Popen([sys.executable, "-c", f"exec(open({__file__!r}).read()); serve()"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env=self.base, cwd=self.files)
        ready = self._message(timeout=300)
        self.preloaded = ready["environment"]
        if ready["loaded"]:  # their settings would be read in the server, not the child
            raise RuntimeError(f"the test zygote imported {ready['loaded']}, whose settings are taken as read later")
        if ready["threads"] != 1:  # a fork copies only the calling thread: a Python thread's locks would stay held
            raise RuntimeError(f"the test zygote has {ready['threads']} Python threads after its imports")

    def _message(self, timeout: float | None) -> dict:
        """The server's next answer; TimeoutError when none comes in `timeout` seconds."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if not select.select([fd], [], [], timeout)[0]:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the test zygote ended (exit code {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def takes(self, args: tuple[str, ...], env: dict) -> bool:
        """Whether `hflow ARGS` in `env` runs here (`eligible`); the server starts at the first call
        that might."""
        if not _forkable(args, env, self.base):
            return False
        if self.proc is None or self.proc.poll() is not None:
            self.pending = b""
            self._start()
        return eligible(args, env, self.base, self.preloaded)

    def run(self, args: tuple[str, ...], cwd: Path | None, env: dict, timeout: float) -> subprocess.CompletedProcess:
        if cwd is not None and not Path(cwd).is_dir():  # as subprocess.run answers it
            raise FileNotFoundError(f"no such folder: {cwd}")
        out, err = self.files / "stdout", self.files / "stderr"
        request = {"args": list(args), "cwd": str(cwd or os.getcwd()), "env": env, "out": str(out), "err": str(err)}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        pid = self._message(timeout=60)["pid"]
        try:
            status = self._message(timeout=timeout)["status"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._message(timeout=60)
            raise subprocess.TimeoutExpired(["hflow", *args], timeout) from None
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return subprocess.CompletedProcess([sys.executable, "-m", "hflow", *args], code,
                                           out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        shutil.rmtree(self.files, ignore_errors=True)


def serve() -> None:
    """The server: import, answer `ready`, then fork one child per request and report its pid and
    its wait status. The requests come on stdin and the answers go to stdout, one JSON line each;
    standard input and output themselves are /dev/null while it imports, so nothing a library
    prints there reaches the protocol."""
    import importlib
    import threading
    import warnings

    requests, answers = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # pytest's ^C is for the tests; the stdin closing ends this
    import hflow.cli  # noqa: F401  (the command's process settings, before torch loads)
    from hflow.cli.quiet import quiet_libraries

    filters = warnings.filters[:]
    quiet_libraries()  # as `hflow train` and `hflow eval` do before their imports
    for name in PRELOAD:
        importlib.import_module(name)
    warnings.filters[:] = filters  # each command sets its own
    # Native threads are the libraries' to hand over a fork (numpy's OpenBLAS pool stops itself
    # before one and starts again when next used, as in a data loader's forked workers).
    ready = {"threads": threading.active_count(), "environment": dict(os.environ),
             "loaded": [name for name in NOT_PRELOADED if name in sys.modules]}
    answers.write(json.dumps(ready).encode() + b"\n")
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                requests.close()
                answers.close()
                _child(request)
            finally:
                os._exit(1)  # never back into this loop, whatever happened
        answers.write(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"status": status}).encode() + b"\n")


def _child(request: dict) -> None:
    """`python -m hflow ARGS` from here on, as a fresh interpreter would run it; never returns."""
    import atexit
    import runpy
    import threading
    import traceback

    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()  # `python -m` puts the working folder first
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv = ["-m", *request["args"]]
    code = 1
    try:
        runpy.run_module("hflow", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except BaseException:
        try:
            sys.excepthook(*sys.exc_info())
        except BaseException:
            traceback.print_exc()
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)
