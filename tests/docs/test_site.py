"""The documentation site builds, and the README stays a one-page guide into it.

`mkdocs build --strict` fails on a broken link or anchor, a page missing from `nav:` and a nav
entry without its page (mkdocs.yml's `validation:`); it runs into a temporary folder, offline."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.rglob("*.md"))
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# the run directory a page names as its example: a run's name carries the date it started
RUN_NAME = re.compile(r"grpo-quickstart-\d{8}-\d{6}")


def test_site_builds_strict(tmp_path):
    """`make setup` installs the docs extra, so in CI a missing MkDocs fails instead of skipping."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        reason = "MkDocs or its Material theme is not installed: pip install -e '.[docs]' (make setup installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must build the docs, but {reason}")
        pytest.skip(reason)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "recipe" / "index.html").is_file()


def test_every_page_has_content():
    for page in PAGES:
        text = page.read_text()
        assert len(text.split()) > 80, f"{page.relative_to(ROOT)} is too short to be a page"
        assert not re.search(r"\bTODO\b|\bTBD\b|coming soon", text, re.I), page.relative_to(ROOT)


def test_dated_figures_live_on_the_benchmarks_page_only():
    for page in [README, *PAGES]:
        if page.name == "benchmarks.md":
            continue
        dates = DATE.findall(RUN_NAME.sub("", page.read_text()))
        assert not dates, f"{page.relative_to(ROOT)} has dated figures {dates}: move them to docs/benchmarks.md"


def test_readme_is_a_one_page_guide():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "README.md is over 200 lines: move the detail into docs/"
    assert "make test" in text  # CI runs the README's test command


def test_readme_links_into_the_docs_resolve():
    """Relative links, as GitHub renders them: each must name a file of the repository."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert any(link.startswith("docs/") for link in local)
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
