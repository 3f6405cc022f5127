"""Process-group set-up: DeepSpeed's CPU op builds even after a process died inside its build;
the choice of device (trainer.device) and each Ray rank's GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hflow.engine.groups import dist
from hflow.errors import UserError

BUILD = "from hflow.engine.groups.dist import build_cpu_comm_op; build_cpu_comm_op()"


@pytest.mark.slow
def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_run():
    """torch waits forever on a build folder's lock file; a process killed while building
    leaves one. The next hflow process removes it (holding hflow's kernel lock, a lock file
    can only be a dead process's) and loads the op."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    folder = subprocess.run([sys.executable, "-c", "from torch.utils.cpp_extension import _get_build_directory; "
                             "print(_get_build_directory('deepspeed_shm_comm', verbose=False))"],
                            env=env, capture_output=True, text=True, check=True).stdout.strip()
    lock = Path(folder) / "lock"
    lock.touch()  # what a build killed with -9 leaves behind
    try:
        done = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=420)
        assert done.returncode == 0, done.stderr[-3000:]
        assert not lock.exists()
    finally:
        lock.unlink(missing_ok=True)  # never leave the suite hanging


# --- device choice: trainer.device, and the GPU of each Ray rank ---------------------------------


def _no_cuda(monkeypatch, tmp_path, *, gpu_files=(), smi=False, problem="The NVIDIA driver on your system is too old"):
    """A machine where torch.cuda.is_available() is False; of the driver's files, those named in
    `gpu_files` exist; `smi`: nvidia-smi is on the PATH."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    files = []
    for name in ("/dev/nvidia0", "/proc/driver/nvidia"):
        stand_in = tmp_path / name.strip("/").replace("/", "-")
        if name in gpu_files:
            stand_in.touch()
        files.append(str(stand_in))
    monkeypatch.setattr(dist, "NVIDIA_FILES", tuple(files))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))

    def init():
        raise RuntimeError(f"{problem} (found version 11040).\nPlease update your GPU driver")

    monkeypatch.setattr(torch.cuda, "init", init)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.parametrize("evidence", [{"gpu_files": ("/dev/nvidia0",)}, {"gpu_files": ("/proc/driver/nvidia",)},
                                      {"smi": True}])
def test_auto_stops_when_a_gpu_is_there_but_cuda_cannot_use_it(monkeypatch, tmp_path, evidence):
    _no_cuda(monkeypatch, tmp_path, **evidence)
    with pytest.raises(UserError) as err:
        dist.pick_device("auto")
    line = str(err.value)
    assert "\n" not in line
    assert "has an NVIDIA GPU, but CUDA cannot use it" in line
    assert "CUDA 12.8" in line and "The NVIDIA driver on your system is too old (found version 11040)" in line
    assert "trainer.device: cpu" in line
    with pytest.raises(UserError, match="CUDA cannot use it"):
        dist.pick_device("cuda")


def test_the_reason_comes_from_the_warning_when_init_does_not_raise(monkeypatch, tmp_path):
    _no_cuda(monkeypatch, tmp_path, gpu_files=("/dev/nvidia0",))

    def init():
        import warnings

        warnings.warn("CUDA initialization: CUDA driver initialization failed, you might not have a CUDA gpu.")

    monkeypatch.setattr(torch.cuda, "init", init)
    with pytest.raises(UserError, match="CUDA initialization: CUDA driver initialization failed"):
        dist.pick_device("auto")


def test_a_cpu_only_torch_build_is_named(monkeypatch, tmp_path):
    _no_cuda(monkeypatch, tmp_path, gpu_files=("/dev/nvidia0",))
    monkeypatch.setattr(torch.version, "cuda", None)

    def init():
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "init", init)
    with pytest.raises(UserError, match=r"CUDA none: a CPU-only build: Torch not compiled with CUDA enabled"):
        dist.pick_device("auto")


def test_auto_is_the_cpu_without_a_gpu_or_with_every_gpu_hidden(monkeypatch, tmp_path):
    _no_cuda(monkeypatch, tmp_path)
    assert dist.pick_device("auto") == torch.device("cpu")
    with pytest.raises(UserError, match="no CUDA GPU is visible; use 'auto' or 'cpu'"):
        dist.pick_device("cuda")
    _no_cuda(monkeypatch, tmp_path, gpu_files=("/dev/nvidia0",))
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert dist.pick_device("auto") == torch.device("cpu")  # asked for, as clearly as trainer.device: cpu
        with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES hides them all"):
            dist.pick_device("cuda")


def test_cpu_is_the_cpu_and_auto_the_gpu_when_cuda_works(monkeypatch, tmp_path):
    _no_cuda(monkeypatch, tmp_path, gpu_files=("/dev/nvidia0",))
    assert dist.pick_device("cpu") == torch.device("cpu")  # chosen deliberately: no question asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dist.pick_device("auto") == torch.device("cuda") == dist.pick_device("cuda")
    assert dist.pick_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("gpu_ids, visible, index", [
    ([3], "3", 0),            # Ray's default: CUDA_VISIBLE_DEVICES is the assigned GPU alone
    (["5"], "5", 0),
    ([3], None, 3),           # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 on a node with none set
    (["3"], "2,3", 1),        # NOSET, the node's list kept: the id's position in it
    (["7"], "4, 5,6,7", 3),
    (["GPU-9a8b"], "GPU-1f2e,GPU-9a8b", 1),  # UUIDs
])
def test_cuda_index_of_the_gpu_ray_assigned(gpu_ids, visible, index):
    assert dist.cuda_index(gpu_ids, visible) == index


def test_cuda_index_refuses_what_it_cannot_map():
    with pytest.raises(RuntimeError, match="without a GPU"):
        dist.cuda_index([], None)
    with pytest.raises(RuntimeError, match="Ray assigned GPU 4, which CUDA_VISIBLE_DEVICES='0,1' does not list"):
        dist.cuda_index([4], "0,1")


@pytest.mark.parametrize("gpu_ids, visible, device", [([2], None, "cuda:2"), ([2], "2", "cuda:0"),
                                                      (["6"], "4,6", "cuda:1")])
def test_each_ray_rank_gets_its_own_gpu_made_current_before_the_role_builds(monkeypatch, gpu_ids, visible, device):
    from types import SimpleNamespace

    from hflow.engine.groups import ray_backend

    current: list[int] = []

    class Recorder:  # a role's worker: records its device and the current one when it is built
        def __init__(self, rank, world_size, device):
            self.device, self.current = device, current[:]

    monkeypatch.setattr(ray_backend, "ray_module", lambda: SimpleNamespace(get_gpu_ids=lambda: gpu_ids))
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    worker = ray_backend.FusedWorker(rank=1, world_size=2, env={})
    worker.add_role("actor", Recorder, "cuda", (), {})
    assert worker.roles["actor"].device == device
    assert worker.roles["actor"].current == [int(device.split(":")[1])]  # set before the worker was built
    worker.add_role("reward", Recorder, "cpu", (), {})
    assert worker.roles["reward"].device == "cpu"


def test_the_process_group_starts_on_the_ranks_gpu(monkeypatch):
    """NCCL and DeepSpeed (cuda:LOCAL_RANK) use the current device: it is set before their init."""
    import deepspeed
    import torch.distributed

    calls = []
    current = [0]
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: (calls.append(("set_device", str(d))),
                                                             current.__setitem__(0, torch.device(d).index)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(deepspeed, "init_distributed", lambda dist_backend, verbose: calls.append(
        ("init", dist_backend, dist.os.environ["LOCAL_RANK"], current[0])))
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "DS_ACCELERATOR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # the import above already chose; keep the suite's
    dist.ensure_process_group(torch.device("cuda:3"), rank=5, world_size=8)
    assert calls == [("set_device", "cuda:3"), ("init", "nccl", "3", 3)]


@pytest.mark.gpu
def test_auto_is_the_gpu_where_cuda_works():
    assert dist.pick_device("auto") == torch.device("cuda")


def test_the_process_group_is_torn_down_before_the_interpreter_exits():
    """A group alive at exit leaks its communicators (NCCL warns on every GPU run): the group that
    ensure_process_group starts is destroyed at exit. atexit runs its handlers last-registered
    first, so a handler registered before the group started sees the state after the teardown."""
    pytest.importorskip("deepspeed")
    code = ("import atexit, torch, torch.distributed as d\n"
            "atexit.register(lambda: print('alive at exit:', d.is_initialized()))\n"
            "from hflow.engine.groups.dist import ensure_process_group\n"
            "ensure_process_group(torch.device('cpu'))\n"
            "print('alive after start:', d.is_initialized())\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DS_ACCELERATOR": "cpu"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["alive after start: True", "alive at exit: False"]
