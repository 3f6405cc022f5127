"""The search's size on the paper's largest case (its time is a benchmark's: benchmarks/map_search.py
prints the whole table), and the GPU-machine path."""

import pytest

from hflow.mapper.devices import DEVICES, detect_gpu, visible_gpus
from hflow.mapper.plan import plan_placement


@pytest.mark.slow
def test_70b_ppo_on_128_gpus_searches_every_placement(paper_recipe):
    """All 15 partitions of the five roles into colocated sets, each with its allocations and
    parallel strategies, are searched (no wall-clock bound here: a busy machine would make one
    flaky; `benchmarks/map_search.py` times it)."""
    plan = plan_placement(paper_recipe("llama2-70b"), 128)
    assert plan["placements_searched"] == 15 and plan["candidates_evaluated"] > 100
    assert plan["search_s"] > 0


@pytest.mark.gpu
def test_visible_gpu_is_detected_and_planned_for(paper_recipe):
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    assert detect_gpu() in DEVICES
    recipe = paper_recipe("llama2-7b").model_copy(deep=True)
    recipe.cluster.gpus, recipe.cluster.gpu = 0, "auto"
    recipe.model.path = "qwen2.5-0.5b"
    recipe.critic.path = recipe.reward.model = "qwen2.5-0.5b"
    plan = plan_placement(recipe)
    assert plan["device"] == detect_gpu() and plan["devices_total"] == visible_gpus()
