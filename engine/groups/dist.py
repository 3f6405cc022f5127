"""Process-group set-up and device choice, shared by every backend.

DeepSpeed reads `DS_ACCELERATOR` when it is first imported, so `prepare_deepspeed`
must run before any `import deepspeed`.
"""

from __future__ import annotations

import logging
import os
import socket

import torch

from hflow.errors import UserError


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("trainer.device is 'cuda' but no CUDA GPU is visible; use 'auto' or 'cpu'")
    return torch.device(name)


def prepare_deepspeed(device: torch.device) -> None:
    """Point DeepSpeed at the right accelerator and keep its logging to warnings."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.type == "cuda" else "cpu")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_process_group(device: torch.device, rank: int = 0, world_size: int = 1) -> None:
    """torch.distributed for this rank (gloo on CPU, NCCL on GPU); a no-op once initialised."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    prepare_deepspeed(device)
    if world_size == 1:
        # A group of one needs no shared rendezvous: always take a fresh local port, so an
        # inherited MASTER_PORT (a parent process's group) cannot collide with ours.
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    # DeepSpeed puts its engine on cuda:LOCAL_RANK. A Ray rank sees only its own GPU (index 0),
    # so the local rank is the device's index in this process, not the global rank.
    local = rank
    if device.type == "cuda":
        local = device.index if device.index is not None else torch.cuda.current_device()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local))
    import deepspeed

    if device.type == "cpu":
        build_cpu_comm_op()
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo",
                               verbose=False)


def build_cpu_comm_op() -> None:
    """Compile (or load) DeepSpeed's shared-memory communication op, which its CPU backend
    builds on first use, so that a killed process cannot hang later runs.

    torch compiles such ops under a lock *file* in the op's build folder and every later
    process waits, forever and silently, while that file exists, so a process killed inside
    the build (kill -9, or a Ray worker ending with its driver) would hang every run after it.
    hflow's processes build inside a kernel lock (flock; the kernel releases it when its holder
    dies, even by kill -9): whoever holds it knows that a lock file left there belongs to a
    dead process and removes it. DeepSpeed keeps the loaded op, so its own load later does
    not build again."""
    import fcntl

    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import _get_build_directory

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return
    folder = _get_build_directory(builder.NAME, verbose=False)
    with open(os.path.join(folder, "hflow.flock"), "a+") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            stale = os.path.join(folder, "lock")
            if os.path.exists(stale):
                logging.getLogger(__name__).warning("removed %s, left by a process killed while building", stale)
                os.remove(stale)
            builder.load(verbose=False)
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak device memory of this process: CUDA allocator peak, or peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
