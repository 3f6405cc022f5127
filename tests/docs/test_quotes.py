"""Code the docs quote is the code: a fenced block right after `<!-- quote: PATH -->` must be a run
of consecutive lines of PATH (relative to the repository root), as they are now."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUOTE = re.compile(r"<!-- quote: (\S+) -->\n```\w*\n(.*?)^```", re.S | re.M)


def quotes(text: str) -> list[tuple[str, list[str]]]:
    return [(path, body.rstrip("\n").split("\n")) for path, body in QUOTE.findall(text)]


def quoted_where(lines: list[str], source: list[str]) -> int | None:
    """The index in `source` where `lines` start as a consecutive run, or None."""
    for start in range(len(source) - len(lines) + 1):
        if source[start:start + len(lines)] == lines:
            return start
    return None


def all_quotes() -> list[tuple[str, str, list[str]]]:
    return [(str(page.relative_to(ROOT)), path, lines)
            for page in sorted((ROOT / "docs").rglob("*.md")) for path, lines in quotes(page.read_text())]


def test_concepts_quote_the_controller():
    assert len([q for q in all_quotes() if q[0] == "docs/concepts.md"]) >= 6


@pytest.mark.parametrize("page, path, lines", all_quotes(), ids=lambda v: v if isinstance(v, str) else "")
def test_quoted_code_is_in_its_file(page, path, lines):
    source = ROOT / path
    assert source.is_file(), f"{page} quotes {path}, which does not exist"
    assert quoted_where(lines, source.read_text().split("\n")) is not None, \
        f"{page}: the code quoted from {path} is no longer there as written; quote it again"


def test_a_changed_quote_is_found():
    text = "<!-- quote: x.py -->\n```python\ndef f():\n    return 1\n```\n"
    [(path, lines)] = quotes(text)
    assert path == "x.py" and quoted_where(lines, ["", "def f():", "    return 1"]) == 1
    assert quoted_where(lines, ["def f():", "    return 2"]) is None
    assert quoted_where(lines, ["    return 1", "def f():"]) is None
