"""Following a growing run file (`events.jsonl`, `samples.jsonl`, `train.log`) while `hflow train`
writes it.

A refresh reads only the bytes appended since the last one (a 100,000-step run costs
the same per refresh as a 10-step one), and a half-written last line is held back until
its newline arrives.
"""

from __future__ import annotations

import json
from pathlib import Path


class LineTail:
    """Follow a growing text file, returning only complete lines.

    ``offset`` is the byte position up to which the file has been read;
    ``partial`` holds the bytes after the last newline (a line the writer has
    not finished). ``bytes_read`` counts every byte ever read, so a caller can
    check that a refresh read only what was appended. If the file shrinks
    (replaced or truncated) reading restarts at 0 and ``resets`` is bumped.
    """

    def __init__(self, path: Path, start_near_end: int | None = None):
        self.path = Path(path)
        self.offset = 0
        self.partial = b""
        self.bytes_read = 0
        self.resets = 0
        # For logs only the tail matters: skip to the last N bytes on first read.
        self._start_near_end = start_near_end

    def size(self) -> int | None:
        """Current file size, None while the file does not exist."""
        try:
            return self.path.stat().st_size
        except OSError:
            return None

    def pending(self) -> bool:
        """True when the file holds bytes this tail has not read yet."""
        return (self.size() or 0) > self.offset

    def poll(self, max_bytes: int = 4 << 20) -> list[bytes]:
        """Read at most ``max_bytes`` new bytes; return the lines they complete."""
        size = self.size()
        if size is None:
            return []  # not written yet, or briefly gone: keep what we have
        if size < self.offset:
            self.offset, self.partial = 0, b""
            self.resets += 1
        skip_first = False
        if self.offset == 0 and self._start_near_end and size > self._start_near_end:
            self.offset, skip_first = size - self._start_near_end, True
        self._start_near_end = None
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(min(size - self.offset, max_bytes))
        self.offset += len(data)
        self.bytes_read += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if skip_first and lines:
            lines.pop(0)  # we started mid-line
        return [ln for ln in lines if ln.strip()]


class JsonlTail(LineTail):
    """A ``LineTail`` over JSON Lines: yields dicts, counts lines that are not."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.bad_lines = 0

    def poll_objects(self, max_bytes: int = 4 << 20) -> list[dict]:
        out = []
        for line in self.poll(max_bytes):
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                out.append(obj)
            else:
                self.bad_lines += 1  # e.g. a line torn by a crash, then resumed
        return out
