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

    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo",
                               verbose=False)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak device memory of this process: CUDA allocator peak, or peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
