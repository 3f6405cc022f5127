"""Shared fixtures: shipped PPO recipes and searches on them (cached: the search is deterministic)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from hflow.mapper.devices import resolve_device
from hflow.mapper.search import Mapper
from hflow.mapper.strategy import Setting
from hflow.mapper.workload import workload_from_recipe
from hflow.trainer.config.load import load_recipe

PPO_DIR = Path(__file__).resolve().parents[2] / "recipes" / "ppo"


# The paper's setting searches ZeRO from stage 1 up (its Megatron plans shard the optimizer states only);
# the recipes ship `actor.zero_stage: 3`, what hflow's ZeRO-only engine needs to fit them.
PAPER_ZERO = ["actor.zero_stage=1"]


@functools.lru_cache(maxsize=None)
def _paper_recipe(name: str):
    recipe, _ = load_recipe(str(PPO_DIR / f"{name}.yaml"), PAPER_ZERO)
    return recipe


@functools.lru_cache(maxsize=None)
def _paper_search(name: str, gpus: int, train_layout: tuple | None = None):
    """Algorithm 1 on a shipped paper recipe, on A100-80GB, 8 per node (Section 8.1)."""
    workload = workload_from_recipe(_paper_recipe(name))
    setting = Setting(workload, resolve_device("a100-80g"), 8, train_layout=train_layout)
    return Mapper(setting).search(gpus)


@pytest.fixture(autouse=True)
def _no_visible_gpu(request, monkeypatch):
    """Plans must not depend on the machine the tests run on (except in `gpu` tests)."""
    if request.node.get_closest_marker("gpu"):
        return
    monkeypatch.setattr("hflow.mapper.devices.visible_gpus", lambda: 0)
    monkeypatch.setattr("hflow.mapper.plan.visible_gpus", lambda: 0)


@pytest.fixture
def paper_recipe():
    """paper_recipe(name): the validated recipe recipes/ppo/<name>.yaml."""
    return _paper_recipe


@pytest.fixture
def paper_search():
    """paper_search(name, gpus, train_layout=None): the SearchResult for a shipped PPO recipe."""
    return _paper_search
