"""The ray backend's watchdog names the call that stalled or failed, once, at the time it should;
the Ray instance hflow starts listens on this machine's loopback address only, with token
authentication on."""

import ipaddress
import os
from pathlib import Path

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.groups.worker import ResourcePool, WorkerError
from helpers import expired_waits

TESTS = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def start_cluster(monkeypatch):
    """A RayCluster that starts its own Ray instance, as `hflow train` does, with the user's
    environment free of any authentication setting; shut down after the test."""
    pytest.importorskip("ray")
    from hflow.engine.groups.ray_backend import RayCluster

    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    # Workers import the test workers from tests/.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    clusters = []

    def start(worker_timeout_s: float) -> RayCluster:
        clusters.append(RayCluster(None, num_cpus=2, worker_timeout_s=worker_timeout_s))
        assert clusters[-1].started
        return clusters[-1]

    yield start
    for cluster in clusters:
        cluster.shutdown()


def _group(cluster, role: str, worker_cls, name: str, ranks: int):
    pool = ResourcePool(name, [f"cpu:{i}" for i in range(ranks)])
    return cluster.add_role(cluster.spawn_pool(pool, use_gpu=False), role, worker_cls, pool)


def test_a_hung_call_is_named_not_the_call_waiting_for_its_result_and_only_once(start_cluster, monkeypatch):
    """The reward's call hangs; the actor's call reads its result, and the controller reads the
    actor's. The watchdog names the reward's call, and fires after one worker_timeout_s (it once
    waited a second period on the actor's pieces, and named the actor)."""
    from faulty_workers import HangingWorker

    cluster = start_cluster(worker_timeout_s=5)
    reward = _group(cluster, "reward", HangingWorker, "rest", 1)
    actor = _group(cluster, "actor", HangingWorker, "actor", 1)
    logprobs = actor.read(reward.hang(Batch({"x": torch.arange(4)})))
    expired = expired_waits(monkeypatch)
    with pytest.raises(WorkerError, match=r"^reward worker rank 0 failed: no answer to hang within 5 s "
                                          r"\(trainer\.worker_timeout_s\)"):
        logprobs["x"]
    assert expired == [5]  # one period of 5 s ran out, not two


def test_a_rank_that_raises_is_reported_while_another_waits_for_it(start_cluster, monkeypatch):
    """Rank 1 raises; rank 0 waits for it in a barrier that never completes. The controller reports
    rank 1's error as it happens, not after waiting out the watchdog on rank 0."""
    from faulty_workers import GivingUpRankWorker

    cluster = start_cluster(worker_timeout_s=300)
    group = _group(cluster, "actor", GivingUpRankWorker, "dp", 2)
    group.join_group()
    expired = expired_waits(monkeypatch)
    with pytest.raises(WorkerError, match=r"^actor worker rank 1 failed: ValueError: rank 1 gave up$"):
        group.barrier_or_raise()
    assert expired == []  # reported as it happened: it once waited on rank 0 until the watchdog's 300 s


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def test_the_local_instance_listens_on_loopback_only_with_token_authentication(start_cluster, monkeypatch,
                                                                               tmp_path):
    """Every listening socket of the instance's processes (GCS, raylet, agents, the workers with
    their torch rendezvous and gloo) is on 127.0.0.1 or ::1; hflow turned no authentication off,
    Ray's token authentication is on with a token of this run that no log holds and that Ray did
    not write to ~/.ray."""
    psutil = pytest.importorskip("psutil")
    from faulty_workers import GivingUpRankWorker
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    from torch.utils.cpp_extension import _get_build_directory

    built = Path(_get_build_directory("deepspeed_shm_comm", verbose=False)).parent
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(built))  # DeepSpeed's op as built, not rebuilt under HOME
    monkeypatch.setenv("HOME", str(tmp_path))
    cluster = start_cluster(worker_timeout_s=120)
    _group(cluster, "actor", GivingUpRankWorker, "dp", 2).join_group()  # the ranks' process group is up
    listening, names = [], set()
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            found = [c.laddr for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
            names.add(process.name())
        except psutil.NoSuchProcess:
            continue
        listening += [(process.name(), address.ip, address.port) for address in found]
    assert {"gcs_server", "raylet"} <= names, names
    assert len(listening) > 5 and all(_loopback(ip) for _, ip, _ in listening), listening
    assert os.environ.get("RAY_AUTH_MODE") != "disabled"
    assert is_token_auth_enabled()
    assert not (tmp_path / ".ray" / "auth_token").exists()
    import ray

    token = os.environ["RAY_AUTH_TOKEN"]
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    assert not [f for f in logs.rglob("*") if f.is_file() and token in f.read_text(errors="replace")]
