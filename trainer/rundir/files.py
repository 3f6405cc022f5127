"""Every file hflow writes in a run directory is opened here, and written through `write_all`.

A run directory may come from someone else (DESIGN.md, "Untrusted input"): its `train.log` or
`status.json.tmp` may be a symbolic link to a file of yours, which a plain `open` would write
through. Files are therefore opened with O_NOFOLLOW, and a link is refused in one line
(`LinkRefused`) instead of followed; `refuse_links` checks a whole run directory before a resume
writes anything in it. `write_all` is the one place a full disk (ENOSPC) is met: the writer turns
that into one line (`RunDir`), and `overwrite` can still record a short status in a file's own
blocks when no new block can be had.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path

from hflow.errors import UserError
from hflow.trainer.rundir.layout import CHECKPOINTS, DAMAGED, WRITTEN


class LinkRefused(UserError):
    """A file of the run directory that hflow would write is a symbolic link."""


def _refused(path: Path) -> LinkRefused:
    return LinkRefused(f"{path} is a symbolic link; hflow does not write through links in a run directory "
                       "(it would overwrite the file it points to): remove the link, or copy the run "
                       "directory without it")


def open_file(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open that never follows a link in the last component (not inherited by child processes)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP and os.path.islink(path):
            raise _refused(path) from None
        raise


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` at the file's position (an OSError such as ENOSPC on failure)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_text(path: Path, text: str, flags: int) -> None:
    fd = open_file(path, os.O_WRONLY | os.O_CREAT | flags)
    try:
        write_all(fd, text.encode())
    finally:
        os.close(fd)


def write(path: Path, text: str) -> None:
    """Create or replace `path` in place (for files in a folder not yet renamed into place)."""
    _write_text(path, text, os.O_TRUNC)


def append(path: Path, text: str) -> None:
    _write_text(path, text, os.O_APPEND)


def atomic_write(path: Path, text: str) -> None:
    """`path` holds `text` whole or keeps what it held: written to `path.tmp`, then renamed over it
    (the rename replaces a link named `path` itself, never its target)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        write_all(fd, text.encode())
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a part-written file would only take up the space that is missing
        raise
    os.close(fd)
    os.replace(tmp, path)


def overwrite(path: Path, text: str) -> None:
    """`path`'s bytes replaced in place, without a temporary file: on a full disk the file's own
    blocks still take a record no longer than it held (a status of a few hundred bytes fits the
    block a shorter one was given). Not atomic: for the last word only (`RunDir.write_status`)."""
    fd = open_file(path, os.O_WRONLY)
    try:
        data = text.encode()
        write_all(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def refuse_links(run_dir: Path) -> None:
    """A LinkRefused naming the first file or folder hflow would write in `run_dir` that is a
    symbolic link: the top-level files, `checkpoints/` and each entry in it and in `damaged/`."""
    checkpoints = run_dir / CHECKPOINTS
    candidates = [run_dir / name for name in WRITTEN]
    for folder in (checkpoints, checkpoints / DAMAGED):
        if folder.is_dir() and not folder.is_symlink():
            candidates.extend(sorted(folder.iterdir()))
    for path in candidates:
        if path.is_symlink():
            raise _refused(path)


class LogFile(logging.Handler):
    """train.log: each record appended through `files.append` (no link followed). A record that
    cannot be written (a full disk, the run directory gone) is dropped without a word: the run's
    own error says what happened, in one line, where logging's default would print a traceback
    for every record."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:  # noqa: BLE001 - a bad log call is a bug: logging's own report
            self.handleError(record)
            return
        with contextlib.suppress(OSError, UserError):
            append(self.path, line)
