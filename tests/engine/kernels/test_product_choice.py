"""The CPU product route kept per machine (`product_route.machine_choice`): the first run here
measures each kind of product, every later one takes its answer, whatever a later measurement would
say; a damaged record is measured again and replaced; of two processes measuring at once, the first
to keep its answer wins for both; a cache someone else could write is neither read nor written."""

import json
import logging

import pytest

from hflow.engine import user_cache
from hflow.engine.kernels import cpu_products, product_route
from helpers import choose_cpu_products

pytestmark = pytest.mark.skipif(not cpu_products.onednn_available(), reason="this torch has no oneDNN")
FASTER, SLOWER = 0.3, 2.0  # oneDNN's time over the BLAS's: clearly faster, clearly slower


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """This test's own cache folder, `auto` asked, a new `chosen_route` cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    choose_cpu_products(monkeypatch, "auto")
    return tmp_path / "cache" / "hflow" / "products"


def _measuring(monkeypatch, *measurements: tuple[float, float, float]) -> list:
    """`faster_by` answering each measurement's ratio for each kind (in `KINDS` order) in turn;
    the kinds it was asked for, in order."""
    calls = []

    def faster_by(kind, *args):
        calls.append(kind)
        return measurements[(len(calls) - 1) // len(product_route.KINDS)][product_route.KINDS.index(kind)]

    monkeypatch.setattr(product_route, "faster_by", faster_by)
    return calls


def _new_run(monkeypatch) -> tuple[str, ...]:
    """`chosen_route` as a new process would answer it."""
    choose_cpu_products(monkeypatch, "auto")
    return product_route.chosen_route()


def test_each_kind_takes_the_library_measured_faster_for_it(monkeypatch, cache):
    """oneDNN where it is faster than the BLAS by more than the margin, the BLAS elsewhere, a tie
    included; the record says each kind's ratio."""
    calls = _measuring(monkeypatch, (FASTER, product_route.MARGIN + 0.01, 1.0))
    assert _new_run(monkeypatch) == ("onednn", "blas", "blas")
    assert calls == list(product_route.KINDS)
    [record] = cache.iterdir()
    kept = json.loads(record.read_text())
    assert kept["route"] == "onednn,blas,blas"
    assert kept["onednn_over_blas"] == {"forward": FASTER, "input_grad": round(product_route.MARGIN + 0.01, 4),
                                        "weight_grad": 1.0}


def test_the_first_run_measures_and_every_later_one_takes_its_answer(monkeypatch, cache):
    calls = _measuring(monkeypatch, (FASTER,) * 3, (SLOWER,) * 3, (SLOWER,) * 3)  # later: slower every time
    assert _new_run(monkeypatch) == _new_run(monkeypatch) == _new_run(monkeypatch) == ("onednn",) * 3
    assert len(calls) == len(product_route.KINDS)
    [record] = cache.iterdir()
    assert json.loads(record.read_text())["route"] == "onednn"
    user_cache.check_own(record)  # the user's own, writable by no one else


@pytest.mark.parametrize("damage", ["", "{not json", '["onednn"]', '{"route": "mkl"}', '{"route": "onednn,blas"}',
                                    '{"route": 3}', '{"choice": "onednn"}'])
def test_a_damaged_record_is_measured_again_and_replaced(monkeypatch, cache, damage):
    calls = _measuring(monkeypatch, (SLOWER,) * 3, (FASTER,) * 3)
    assert _new_run(monkeypatch) == ("blas",) * 3
    [record] = cache.iterdir()
    record.write_text(damage)
    assert _new_run(monkeypatch) == ("onednn",) * 3 and len(calls) == 2 * len(product_route.KINDS)
    assert json.loads(record.read_text())["route"] == "onednn"
    assert [p.name for p in cache.iterdir()] == [record.name]  # no temporary file left


def test_of_two_processes_measuring_at_once_the_first_kept_wins_for_both(monkeypatch, cache):
    """Another process keeps "blas" while this one measures oneDNN faster: this one takes "blas"."""
    key = product_route._machine_key()

    def measured_while_another_keeps_its_own(*args):
        cache.mkdir(parents=True, exist_ok=True)
        (cache / f"route-{key}.json").write_text(json.dumps({"route": "blas"}))
        return FASTER

    monkeypatch.setattr(product_route, "faster_by", measured_while_another_keeps_its_own)
    assert _new_run(monkeypatch) == ("blas",) * 3
    assert json.loads((cache / f"route-{key}.json").read_text()) == {"route": "blas"}


def test_a_cache_someone_else_could_write_is_neither_read_nor_written(monkeypatch, cache, caplog):
    calls = _measuring(monkeypatch, (SLOWER,) * 3, (FASTER,) * 3)
    assert _new_run(monkeypatch) == ("blas",) * 3
    [record] = cache.iterdir()
    record.write_text(json.dumps({"route": "onednn"}))
    record.chmod(0o666)
    with caplog.at_level(logging.INFO, logger=product_route.__name__):
        assert _new_run(monkeypatch) == ("onednn",) * 3  # measured for this process: oneDNN now
    assert "writable by its group or others" in caplog.text and len(calls) == 2 * len(product_route.KINDS)
    assert json.loads(record.read_text()) == {"route": "onednn"}  # left as it was found
