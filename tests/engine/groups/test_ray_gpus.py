"""Each Ray rank on its own GPU: `cuda:<index>` of the GPU Ray assigned, current before the role
builds, whether or not Ray sets CUDA_VISIBLE_DEVICES (the mapping itself: test_dist.py)."""

import os
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("noset", [False, True], ids=["ray-sets-visible-devices", "noset"])
def test_each_rank_runs_on_the_gpu_ray_assigned_it(monkeypatch, noset):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("needs a Ray instance of its own (the variables below reach workers through it)")
    from device_workers import DeviceWorker

    from hflow.engine.groups.ray_backend import RayCluster
    from hflow.engine.groups.worker import ResourcePool

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    if noset:  # Ray leaves CUDA_VISIBLE_DEVICES alone: plain "cuda" would put every rank on GPU 0
        monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    else:
        monkeypatch.delenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", raising=False)
    gpus = torch.cuda.device_count()
    uuids = {str(torch.cuda.get_device_properties(i).uuid) for i in range(gpus)}
    cluster = RayCluster(None, worker_timeout_s=120)
    try:
        pool = ResourcePool("gpus", [f"cuda:{i}" for i in range(gpus)])
        group = cluster.add_role(cluster.spawn_pool(pool, use_gpu=True), "reward", DeviceWorker, pool)
        ranks = group.where()
    finally:
        cluster.shutdown()
    assert len(ranks) == gpus
    assert {r["uuid"] for r in ranks} == uuids  # one rank per GPU: no two on the same one
    for r in ranks:
        assert r["device"] == f"cuda:{r['current']}"  # the rank's GPU is the current device
    if noset:
        assert sorted(r["current"] for r in ranks) == list(range(gpus))
    else:
        assert all(r["current"] == 0 and r["visible"] is not None for r in ranks)
