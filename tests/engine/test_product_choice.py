"""The CPU product route kept per machine (`cpu_products.machine_choice`): the first run here
measures, every later one takes its answer, whatever a later measurement would say; a damaged
record is measured again and replaced; of two processes measuring at once, the first to keep its
answer wins for both; a cache someone else could write is neither read nor written."""

import json
import logging

import pytest

from hflow.engine import cpu_products, user_cache
from helpers import choose_cpu_products

pytestmark = pytest.mark.skipif(not cpu_products.onednn_available(), reason="this torch has no oneDNN")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """This test's own cache folder, `auto` asked, a new `onednn_chosen` cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    choose_cpu_products(monkeypatch, "auto")
    return tmp_path / "cache" / "hflow" / "products"


def _measuring(monkeypatch, *ratios: float) -> list:
    """`faster_by` answering `ratios` in turn (oneDNN's time over the BLAS's), its calls counted."""
    calls = []

    def faster_by(*args):
        calls.append(1)
        return ratios[len(calls) - 1]

    monkeypatch.setattr(cpu_products, "faster_by", faster_by)
    return calls


def _new_run(monkeypatch) -> bool:
    """`onednn_chosen` as a new process would answer it."""
    choose_cpu_products(monkeypatch, "auto")
    return cpu_products.onednn_chosen()


def test_the_first_run_measures_and_every_later_one_takes_its_answer(monkeypatch, cache):
    calls = _measuring(monkeypatch, 0.3, 2.0, 2.0)  # oneDNN faster first, slower in every later measurement
    assert _new_run(monkeypatch) and _new_run(monkeypatch) and _new_run(monkeypatch)
    assert len(calls) == 1
    [record] = cache.iterdir()
    assert json.loads(record.read_text())["choice"] == "onednn"
    assert json.loads(record.read_text())["onednn_over_blas"] == 0.3
    user_cache.check_own(record)  # the user's own, writable by no one else


@pytest.mark.parametrize("damage", ["", "{not json", '["onednn"]', '{"choice": "mkl"}'])
def test_a_damaged_record_is_measured_again_and_replaced(monkeypatch, cache, damage):
    calls = _measuring(monkeypatch, 2.0, 0.3)
    assert not _new_run(monkeypatch)
    [record] = cache.iterdir()
    record.write_text(damage)
    assert _new_run(monkeypatch) and len(calls) == 2  # measured again: oneDNN this time
    assert json.loads(record.read_text())["choice"] == "onednn"
    assert [p.name for p in cache.iterdir()] == [record.name]  # no temporary file left


def test_of_two_processes_measuring_at_once_the_first_kept_wins_for_both(monkeypatch, cache):
    """Another process keeps "blas" while this one measures oneDNN faster: this one takes "blas"."""
    key = cpu_products._machine_key()

    def measured_while_another_keeps_its_own(*args):
        cache.mkdir(parents=True, exist_ok=True)
        (cache / f"choice-{key}.json").write_text(json.dumps({"choice": "blas"}))
        return 0.3

    monkeypatch.setattr(cpu_products, "faster_by", measured_while_another_keeps_its_own)
    assert not _new_run(monkeypatch)
    assert json.loads((cache / f"choice-{key}.json").read_text()) == {"choice": "blas"}


def test_a_cache_someone_else_could_write_is_neither_read_nor_written(monkeypatch, cache, caplog):
    calls = _measuring(monkeypatch, 2.0, 0.3)
    assert not _new_run(monkeypatch)
    [record] = cache.iterdir()
    record.write_text(json.dumps({"choice": "onednn"}))
    record.chmod(0o666)
    with caplog.at_level(logging.INFO, logger=cpu_products.__name__):
        assert _new_run(monkeypatch)  # measured for this process: oneDNN now
    assert "writable by its group or others" in caplog.text and len(calls) == 2
    assert json.loads(record.read_text()) == {"choice": "onednn"}  # left as it was found
