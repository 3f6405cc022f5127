"""What hflow keeps for this user on this machine between runs: `$XDG_CACHE_HOME/hflow/<name>`
(`~/.cache/hflow/<name>`): the compiled CPU kernels (`kernels/build.py`) and the CPU product
route measured here (`product_route.py`).

A file there steers what a process runs (a kernel is code it loads; the route, which library
multiplies), so the folders, and every file read from them, must be the user's own and writable by
no one else: `folder` and `check_own` refuse anything else (`NotOwn`), and the caller then goes on
without the cache. `cpu_identity` names the CPU a cached result holds for: a home directory shared
by machines of different CPUs keeps one result per CPU.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotOwn(Exception):
    """A cache folder or file this process must not trust: why, in words."""


def folder(name: str) -> Path:
    """hflow's cache folder `name`, made if missing (mode 0700); it and hflow's folder above it
    must be the user's own."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "hflow" / name
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_own(path.parent)
    check_own(path)
    return path


def check_own(path: Path) -> None:
    """`path` (a folder, or a file this process will read or load): not a symbolic link, the
    user's own, writable by no one else; else `NotOwn`."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise NotOwn(f"{path} is a symbolic link")
    if st.st_uid != os.getuid():
        raise NotOwn(f"{path} belongs to another user (uid {st.st_uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NotOwn(f"{path} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):o})")


def cpu_identity() -> str:
    """The CPU's model and instruction flags, as /proc/cpuinfo gives them (the machine's
    architecture where it cannot be read)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    wanted = [line for line in lines if line.split(":")[0].strip() in {"model name", "flags", "Features"}]
    return "\n".join(dict.fromkeys(wanted))
