"""The limits of a bubblewrap sandbox (`sandbox.py`) over its whole process tree, watched from
outside while it runs: wall clock, CPU seconds and memory summed over all of its processes,
and its output.

The sandbox's own `/proc`, seen from outside as `/proc/<init>/root/proc` (its init is PID 1
inside; bwrap's --info-fd names it), lists exactly its processes. Every `POLL_S` their CPU time
is summed with their children's (utime, stime, cutime, cstime: a process that ended and was
reaped counts in its parent's, the init reaping orphans), so a chain of short-lived forks adds
up; memory is their resident memory plus what the sandbox's tmpfs folders hold. Past a limit,
or past `timeout_s`, or with more output than `output_bytes`, the init gets SIGKILL (through a
pidfd, never a recycled PID): the kernel kills every process of the PID namespace, and bwrap
exits only once they are all gone.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass

POLL_S = 0.05  # how often the sandbox's CPU time and memory are sampled


@dataclass(frozen=True)
class Limits:
    """What one call may use; CPU and memory are summed over all of its processes."""

    timeout_s: float = 10.0  # wall clock
    cpu_s: float = 5.0  # CPU seconds
    memory_mb: int = 1024  # resident memory plus what its tmpfs folders hold; each process's address space
    processes: int = 32  # processes (and threads) at once
    disk_mb: int = 64  # the writable /tmp
    output_bytes: int = 1 << 16  # stdout and stderr together; past it the sandbox is killed


@dataclass(frozen=True)
class Outcome:
    """What a call printed (stdout and stderr, interleaved, at most the output limit) and how it
    ended: "" for exit code 0, else one line ("exit code 1", "error: killed: ...")."""

    output: bytes
    ending: str


def watch(proc: subprocess.Popen, info_fd: int, out_fd: int, limits: Limits) -> Outcome:
    """Collect the output of the sandbox bwrap `proc` runs until it ends, killing it at a limit;
    what it printed, how it ended. `info_fd`: bwrap's --info-fd; `out_fd`: its stdout and stderr."""
    init = _Init(info_fd)
    deadline = time.monotonic() + limits.timeout_s
    output, ending, next_check, reading = bytearray(), None, 0.0, [out_fd]
    while ending is None and proc.poll() is None:
        if select.select(reading, [], [], POLL_S)[0]:
            chunk = os.read(out_fd, 1 << 16)
            output += chunk
            reading = reading if chunk else []  # closed: only wait for the end now
        if len(output) > limits.output_bytes:
            ending = f"error: killed: output limit of {limits.output_bytes} bytes"
        elif time.monotonic() >= next_check:
            next_check = time.monotonic() + POLL_S
            ending = _over(init, limits, deadline)
    if ending is not None:
        init.kill(proc)
    proc.wait()
    init.close()
    # Everything that held the pipe is gone now (the PID namespace is empty); the rest of it:
    while len(output) <= limits.output_bytes and select.select([out_fd], [], [], 5.0)[0]:
        chunk = os.read(out_fd, 1 << 16)
        if not chunk:
            break
        output += chunk
    return Outcome(bytes(output[:limits.output_bytes]), ending or _exit_ending(proc.returncode, limits))


def _over(init: _Init, limits: Limits, deadline: float) -> str | None:
    """The limit the sandbox has passed, as its ending line, or None."""
    init.read()
    cpu_s, memory = init.usage()
    if time.monotonic() > deadline:
        return f"error: timed out after {limits.timeout_s:g} s (wall clock)"
    if cpu_s > limits.cpu_s:
        return f"error: killed: CPU time limit of {limits.cpu_s:g} s (all its processes together)"
    if memory > limits.memory_mb << 20:
        return f"error: killed: memory limit of {limits.memory_mb} MB (all its processes together)"
    return None


def _exit_ending(code: int, limits: Limits) -> str:
    """bwrap exits with the code's exit code, or 128 + the signal that killed it."""
    if code == 0:
        return ""
    signum = code - 128 if 128 < code < 128 + signal.NSIG else -code if code < 0 else 0
    if signum == signal.SIGXCPU:
        return f"error: killed (CPU time limit of {limits.cpu_s:g} s)"
    if signum == signal.SIGXFSZ:
        return f"error: killed (file size limit of {limits.disk_mb} MB)"
    try:
        return f"error: killed by signal {signal.Signals(signum).name}" if signum else f"exit code {code}"
    except ValueError:  # no such signal: the program's own exit code
        return f"exit code {code}"


class _Init:
    """The sandbox's init (PID 1 inside), from bwrap's --info-fd: where its /proc is seen from
    outside, and what to kill. A pidfd holds it, so a recycled PID is never signalled."""

    def __init__(self, info_fd: int):
        self.info_fd, self.text, self.pid, self.pidfd = info_fd, b"", None, None

    def read(self) -> None:
        while self.pid is None and select.select([self.info_fd], [], [], 0)[0]:
            chunk = os.read(self.info_fd, 4096)
            if not chunk:
                return
            self.text += chunk
            try:
                self.pid = int(json.loads(self.text)["child-pid"])
            except (ValueError, KeyError):
                continue
            try:
                self.pidfd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):
                self.pidfd = None

    def usage(self) -> tuple[float, int]:
        """CPU seconds of the sandbox's processes (with those reaped) and its memory in bytes."""
        if self.pid is None:
            return 0.0, 0
        root = f"/proc/{self.pid}/root"
        ticks, pages = 0, 0
        try:
            if os.stat(f"{root}/proc").st_dev == os.stat("/proc").st_dev:
                return 0.0, 0  # bwrap is still setting up: its root is not the sandbox's yet
            names = [n for n in os.listdir(f"{root}/proc") if n.isdigit()]
        except OSError:
            return 0.0, 0
        for name in names:
            try:
                with open(f"{root}/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue  # it ended meanwhile: its times are in its parent's
            ticks += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
            pages += int(fields[21])  # rss
        memory = pages * os.sysconf("SC_PAGE_SIZE") + sum(_used(f"{root}{d}") for d in ("/tmp", "/dev/shm"))
        return ticks / os.sysconf("SC_CLK_TCK"), memory

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL to the init: the kernel kills the whole PID namespace. Without one yet, bwrap
        itself (--die-with-parent takes the rest)."""
        self.read()
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            elif self.pid is not None:
                os.kill(self.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass
        self.close()

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _used(path: str) -> int:
    try:
        s = os.statvfs(path)
    except OSError:
        return 0
    return (s.f_blocks - s.f_bfree) * s.f_frsize
