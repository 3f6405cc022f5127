"""Model-written Python run in a bubblewrap sandbox (`bwrap`): the default of the code tool
(`code_tool.py`), and the only way hflow runs such code unless a recipe opts out.

    outcome = run_sandboxed("print(6 * 7)", Limits(timeout_s=10, cpu_s=5, memory_mb=1024))
    outcome.output, outcome.ending      # b"42\\n", ""

Why bubblewrap: it is the small tool Flatpak builds on, packaged everywhere (Debian/Ubuntu
`bubblewrap`), that makes Linux namespaces from one command line, with no daemon, no image and
no root. What each call gets:

- **Its own filesystem view.** Read-only: `/usr` (and the `/bin`, `/lib*`, `/sbin` links or
  folders beside it), `/etc/ld.so.cache`, and the Python interpreter's own prefix (its stdlib).
  Every site-packages folder of that interpreter is hidden under an empty read-only folder, so the
  model's code has the standard library and nothing installed. Writable: a fresh tmpfs at `/tmp`
  (its cwd and HOME, `disk_mb`) and `/dev/shm` (at most 16 MiB, for `multiprocessing`'s locks);
  everything else (`/`, `/dev`) is read-only. Nothing of the run directory, the project, the
  user's home, `/etc` (no `passwd`, no `shadow`), the trainer's virtual environment or any
  socket on the filesystem is in the view. The code arrives as `/tmp/main.py`, read-only.
- **No network**: a network namespace of its own, with only a loopback of its own. Abstract Unix
  sockets (Ray's, X11's) belong to the network namespace, so they are out of reach too.
- **Its own PID namespace, user namespace, IPC and UTS namespaces**: `/proc` shows only the
  sandbox's processes, so no `/proc/<pid>/environ` of the trainer; the environment is a fresh
  one (PATH, HOME, LANG, TMPDIR); the code runs as uid/gid 65534 with no capabilities
  (`--cap-drop ALL`), in a new session (`--new-session`: no TIOCSTI into a terminal), and with
  no further user namespaces where bwrap >= 0.8 can forbid them (`--disable-userns`). The
  trainer cannot be signalled: it has no PID in the sandbox, and the sandbox's init (PID 1)
  ignores signals from inside.
- **Limits over the whole process tree.** In the sandbox, before the code starts, a launcher
  sets RLIMIT_NPROC (`processes`: counted per user namespace, so only this sandbox's processes
  count), RLIMIT_CPU and RLIMIT_AS (each process), RLIMIT_FSIZE (each file) and RLIMIT_CORE 0.
  From outside, `sandbox_limits.watch` samples the CPU time and memory of all its processes
  together (reaped ones too) and reads its output, killing the whole sandbox past `cpu_s`,
  `memory_mb`, `output_bytes` or the wall-clock `timeout_s`. (Memory between two samples may
  briefly overshoot by what the processes allocate in 50 ms; each process alone is capped by
  RLIMIT_AS. Pages shared after a fork count once per process: the limit errs on the safe
  side.) cgroups would account the same exactly, but need a cgroup tree delegated to the
  caller, which containers and CI machines rarely give; these limits need nothing.
- **Nothing left when the call returns.** The call ends when the program's first process ends
  or is killed; either way the sandbox's init (PID 1) dies, the kernel kills every process of
  the PID namespace with it, `setsid` daemons too, and the init is reaped only once they are all
  gone, so when bwrap has exited the namespace is empty. `--die-with-parent` kills the sandbox
  if the trainer dies.

What it needs from the host: bubblewrap installed (`apt-get install bubblewrap`), and user
namespaces for the user who runs hflow (the default on Debian, Ubuntu, Fedora and Arch kernels;
`sysctl user.max_user_namespaces` above 0; Ubuntu 24.04's AppArmor profile for bwrap allows
them), or a setuid bwrap. As root, bwrap is started as uid/gid 65534 (`nobody`): RLIMIT_NPROC
does not apply to root's processes, and the sandbox's processes must not be root's outside it.
The interpreter must then be readable by everyone: the trainer's own base interpreter when it
is (the venv's, not the venv), else `/usr/bin/python3`. `problem()` says, in one line, why the
sandbox cannot run here; `code_tool.check` asks it at start-up.

What it does not contain: a kernel bug reached through a system call (there is no seccomp
filter), CPU caches and other side channels, and what the model's code prints, which comes
back to the trainer as text. For code that is hostile by design, run it on other machines
(`code_tool`'s `http` sandbox) or in a VM.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hflow.engine.rollout.sandbox_limits import Limits, Outcome, watch
from hflow.errors import UserError

SANDBOX_ID = 65534  # uid and gid inside the sandbox (`nobody`), and outside it when hflow runs as root
SHM_MB = 16  # /dev/shm's size, at most
SYSTEM = ("/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin")  # beside /usr: links into it, or folders
INSTALL = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"

# Runs inside the sandbox before the model's code, which it replaces (exec): limits the code
# cannot raise again. RLIMIT_NPROC counts this user namespace's processes only.
LAUNCHER = """import os, resource, sys
cpu, mem, fsize, nproc = (int(v) for v in sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu s, SIGKILL a second later
for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NPROC, nproc),
                     (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
os.execv(sys.executable, [sys.executable, "-I", "/tmp/main.py"])
"""

# What the interpreter needs bound: its prefixes, and the site-packages folders to hide.
PROBE = ("import json, site, sys; print(json.dumps({'prefixes': sorted({sys.prefix, sys.exec_prefix}), "
         "'sites': site.getsitepackages()}))")


class SandboxUnavailable(UserError):
    """The sandbox cannot run on this machine (bwrap missing or refused); the run stops."""


@dataclass(frozen=True)
class Interpreter:
    """The Python the sandbox runs, what of it is bound read-only, and what is hidden."""

    path: str
    prefixes: tuple[str, ...]  # bound read-only
    sites: tuple[str, ...]  # hidden


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def problem() -> str | None:
    """Why the sandbox cannot run here (one line), or None. Runs one program in it (a few tens of
    milliseconds; the answer is kept per bwrap binary)."""
    path = bwrap_path()
    if path is None:
        return f"bubblewrap (bwrap) is not installed; {INSTALL}"
    return _trial(path)


@functools.cache
def _trial(path: str) -> str | None:
    try:
        outcome = run_sandboxed("print(6 * 7)", Limits(timeout_s=30, cpu_s=10))
    except SandboxUnavailable as err:
        return str(err)
    if outcome.output.strip() != b"42" or outcome.ending:
        text = (outcome.output.decode("utf-8", "replace").strip().splitlines() or [outcome.ending])[-1]
        return (f"bwrap ({path}) cannot start a sandbox here: {text}; it needs user namespaces "
                "(sysctl user.max_user_namespaces above 0) or a setuid bwrap")
    return None


def run_sandboxed(code: str, limits: Limits = Limits()) -> Outcome:
    """Run `code` with `limits` in a fresh sandbox (see the module docstring); every process of
    it is gone when this returns."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed; {INSTALL}")
    python = interpreter()
    with contextlib.ExitStack() as stack:
        code_file = stack.enter_context(tempfile.TemporaryFile())  # bwrap copies it in: /tmp/main.py
        code_file.write(code.encode())
        code_file.flush()
        code_file.seek(0)
        (info_r, info_w), (out_r, out_w) = os.pipe(), os.pipe()
        for fd in (info_r, out_r):
            stack.callback(os.close, fd)
        try:
            proc = subprocess.Popen(_command(bwrap, python, limits, code_file.fileno(), info_w),
                                    stdin=subprocess.DEVNULL, stdout=out_w, stderr=subprocess.STDOUT,
                                    env={},  # bwrap's init keeps it, readable inside: nothing
                                    start_new_session=True, pass_fds=(code_file.fileno(), info_w),
                                    **_unprivileged())
        except OSError as err:
            raise SandboxUnavailable(f"bwrap ({bwrap}) cannot be started: {err.strerror or err}") from None
        finally:
            os.close(info_w)
            os.close(out_w)
        return watch(proc, info_r, out_r, limits)


def _unprivileged() -> dict:
    """As root, bwrap (and so the sandbox) runs as `nobody`: root's processes escape RLIMIT_NPROC."""
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_ID, "group": SANDBOX_ID, "extra_groups": []}


def _command(bwrap: str, python: Interpreter, limits: Limits, code_fd: int, info_fd: int) -> list[str]:
    features = _features(bwrap)
    args = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID),
            "--hostname", "sandbox", "--cap-drop", "ALL", "--die-with-parent", "--new-session",
            "--info-fd", str(info_fd), "--ro-bind", "/usr", "/usr", "--ro-bind-try", "/etc/ld.so.cache",
            "/etc/ld.so.cache"]
    if "--disable-userns" in features:
        args.append("--disable-userns")
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for prefix in python.prefixes:
        if not _under(prefix, "/usr"):
            args += ["--ro-bind", prefix, prefix]
    for site in python.sites:
        args += ["--tmpfs", site, "--remount-ro", site]
    sized = "--size" in features
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += [*(["--size", str(limits.disk_mb << 20)] if sized else []), "--tmpfs", "/tmp"]
    args += [*(["--size", str(min(limits.disk_mb, SHM_MB) << 20)] if sized else []), "--tmpfs", "/dev/shm"]
    args += ["--ro-bind-data", str(code_fd), "/tmp/main.py", "--remount-ro", "/dev", "--remount-ro", "/",
             "--chdir", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    # RLIMIT_FSIZE above /tmp's size: a full /tmp is "No space left on device", not a killed program
    rlimits = (math.ceil(limits.cpu_s), limits.memory_mb << 20, (limits.disk_mb + 1) << 20, limits.processes)
    return [*args, "--", python.path, "-I", "-S", "-c", LAUNCHER, *map(str, rlimits)]


@functools.cache
def _features(bwrap: str) -> frozenset[str]:
    """The options of this bwrap that not every version has (--size and --disable-userns: 0.8)."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(option for option in ("--size", "--disable-userns") if option in text)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@functools.cache
def interpreter() -> Interpreter:
    """The Python that runs the model's code: the trainer's base interpreter (not its venv), or
    /usr/bin/python3 when hflow runs as root and the sandbox's `nobody` cannot read the former."""
    base = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    for path in (base, "/usr/bin/python3"):
        if not os.path.isfile(path):
            continue
        try:
            found = json.loads(subprocess.run([path, "-I", "-S", "-c", PROBE], capture_output=True, text=True,
                                              env={}, timeout=30, check=True).stdout)
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
        prefixes = tuple(os.path.realpath(p) for p in found["prefixes"])
        if os.geteuid() == 0 and not all(_readable_by_all(p) for p in (os.path.realpath(path), *prefixes)):
            continue
        sites = tuple(s for s in map(os.path.realpath, found["sites"])
                      if os.path.isdir(s) and any(_under(s, f) for f in (*prefixes, "/usr")))
        return Interpreter(os.path.realpath(path), prefixes, sites)
    raise SandboxUnavailable(f"no Python interpreter the sandbox can run: {base} is not readable by uid "
                             f"{SANDBOX_ID} and there is no /usr/bin/python3; install python3 from the "
                             "system's packages")


def _readable_by_all(path: str) -> bool:
    """Whether any user may reach `path` (every folder above it searchable, it readable)."""
    parts = Path(path).parts
    for depth in range(1, len(parts)):
        if not os.stat(Path(*parts[:depth])).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)
