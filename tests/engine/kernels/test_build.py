"""Building and loading a kernel (engine/kernels/build.py): built once per CPU into the user's own
cache, refused from a folder or file someone else could have written, and answered None (the torch
path kept, the reason logged) wherever it cannot be built or is turned off."""

import logging
import os
import shutil
import stat

import pytest

from hflow.engine.kernels import build
from hflow.errors import UserError

COMPILER = shutil.which("cc") or shutil.which("gcc")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C compiler: nothing to build here")


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """Each test with its own cache folder and no load remembered (before and after)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HFLOW_CPU_KERNELS", raising=False)
    build.load.cache_clear()
    yield
    build.load.cache_clear()


def _compiler(tmp_path, body: str) -> str:
    script = tmp_path / "cc"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@needs_compiler
def test_built_once_into_the_user_s_own_folder(monkeypatch, tmp_path):
    log = tmp_path / "builds"
    monkeypatch.setenv("CC", _compiler(tmp_path, f'[ "$1" = --version ] || echo build >> {log}\nexec {COMPILER} "$@"'))
    first = build._library("decode_attention")
    second = build._library("decode_attention")
    assert first == second and first.parent == tmp_path / "cache" / "hflow" / "kernels"
    assert log.read_text().splitlines() == ["build"]
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary file left
    for path in (first, first.parent):
        assert not os.stat(path).st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    assert build.load("decode_attention") is not None


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("HFLOW_CPU_KERNELS", "off")
    assert build.load("decode_attention") is None


def test_a_setting_that_is_neither_on_nor_off_is_refused_before_a_run_starts(monkeypatch, tmp_path):
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.control.preflight import check_runtime

    monkeypatch.setenv("HFLOW_CPU_KERNELS", "maybe")
    recipe, origin = load_recipe("grpo/quickstart", [])
    with pytest.raises(UserError) as err:
        check_runtime(recipe, origin)
    assert str(err.value) == "environment HFLOW_CPU_KERNELS='maybe': accepted values are on, off"


@pytest.mark.parametrize("how", ["folder", "library", "link"])
@needs_compiler
def test_a_cache_someone_else_could_write_is_not_loaded(monkeypatch, tmp_path, caplog, how):
    folder = tmp_path / "cache" / "hflow" / "kernels"
    if how == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.parent.mkdir(parents=True)
        folder.symlink_to(tmp_path / "elsewhere")
        expected = "symbolic link"
    else:
        library = build._library("decode_attention")
        (library.parent if how == "folder" else library).chmod(0o777)
        expected = "writable by its group or others"
    with caplog.at_level(logging.INFO, logger=build.__name__):
        assert build.load("decode_attention") is None
    assert expected in caplog.text and "torch path" in caplog.text


def test_a_failed_build_keeps_the_torch_path_and_says_why(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", _compiler(tmp_path, '[ "$1" = --version ] && { echo "cc 1.0"; exit 0; }\n'
                                                 'echo "decode_attention.c:1: error: boom" >&2\nexit 1'))
    with caplog.at_level(logging.INFO, logger=build.__name__):
        assert build.load("decode_attention") is None
    assert "building decode_attention.c failed (exit 1): decode_attention.c:1: error: boom" in caplog.text
    assert list((tmp_path / "cache" / "hflow" / "kernels").iterdir()) == []  # nothing half-built kept


def test_no_compiler(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level(logging.INFO, logger=build.__name__):
        assert build.load("decode_attention") is None
    assert "no C compiler" in caplog.text


@needs_compiler
def test_a_changed_header_is_a_new_build(monkeypatch, tmp_path):
    """The headers the sources include are part of the build's name: an edited one is rebuilt."""
    sources = tmp_path / "sources"
    shutil.copytree(build.SOURCES, sources, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(build, "SOURCES", sources)
    first = build._library("layers")
    header = sources / "vector_math.h"
    header.write_text(header.read_text() + "\n/* edited */\n")
    assert build._library("layers") != first
