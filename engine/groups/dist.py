"""Process-group set-up and device choice, shared by every backend.

DeepSpeed reads `DS_ACCELERATOR` when it is first imported, so `prepare_deepspeed`
must run before any `import deepspeed`.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import ipaddress
import logging
import os
import shutil
import socket
import warnings

import torch

from hflow.errors import UserError, first_line


def pick_device(name: str) -> torch.device:
    """The device of `trainer.device`: `auto` is the GPU when CUDA can use one, the CPU when the
    machine has no NVIDIA GPU (or CUDA_VISIBLE_DEVICES hides them all, deliberately).

    A machine with an NVIDIA GPU that CUDA cannot use (a driver older than this torch's CUDA, a
    CPU-only torch build) is an error, not a silent CPU run: a run meant for the GPU would go on
    for hours at a fraction of the speed before anyone noticed."""
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if nvidia_gpu_present() and not gpus_hidden():
        raise UserError(f"trainer.device is {name!r} and this machine has an NVIDIA GPU, but CUDA cannot use it "
                        f"({cuda_problem()}); fix the driver or the torch build, or set trainer.device: cpu to "
                        "run on the CPU deliberately")
    if name == "cuda":
        hidden = " (CUDA_VISIBLE_DEVICES hides them all)" if gpus_hidden() else ""
        raise UserError(f"trainer.device is 'cuda' but no CUDA GPU is visible{hidden}; use 'auto' or 'cpu'")
    return torch.device("cpu")


# The NVIDIA driver's files: the first GPU's device node and the kernel module's /proc entry.
NVIDIA_FILES = ("/dev/nvidia0", "/proc/driver/nvidia")


def nvidia_gpu_present() -> bool:
    """Whether the machine has an NVIDIA GPU, asked of the driver's files rather than of CUDA
    (which is what may be broken): `NVIDIA_FILES`, or `nvidia-smi` on the PATH."""
    return any(os.path.exists(path) for path in NVIDIA_FILES) or shutil.which("nvidia-smi") is not None


def gpus_hidden() -> bool:
    """Whether CUDA_VISIBLE_DEVICES hides every GPU (set to nothing, or to -1: CUDA's documented
    way of running on none), which asks for the CPU as clearly as `trainer.device: cpu` does."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and visible.strip() in ("", "-1")


def cuda_problem() -> str:
    """Why torch cannot use CUDA, in its own words where it says: initialising CUDA raises the
    reason ("The NVIDIA driver on your system is too old (found version 11040)...", "Torch not
    compiled with CUDA enabled"); `torch.cuda.is_available` only warns it, once per process."""
    build = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none: a CPU-only build'}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.cuda.init()
        except Exception as err:  # torch raises RuntimeError or AssertionError, by cause
            return f"{build}: {first_line(err)}"
    said = [line for w in caught for line in str(w.message).strip().splitlines()[:1]]
    return f"{build}: {said[0] if said else 'torch.cuda.is_available() is False'}"


def cuda_index(gpu_ids: list, visible: str | None) -> int:
    """This process's CUDA index of the GPU Ray assigned it (`ray.get_gpu_ids()`).

    Ray names a GPU by its id on the node and, by default, sets the worker's
    CUDA_VISIBLE_DEVICES to it, so the process sees it as index 0. With
    RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 Ray leaves the variable as the node had it:
    unset, every GPU is visible and the id is the index; set (say "2,3"), Ray's ids are its
    entries and the index is the position in it (Ray docs, "Accelerator support", and
    ray/_private/accelerators/nvidia_gpu.py). Plain "cuda" would be index 0 in every rank: all
    ranks on one GPU."""
    if not gpu_ids:
        raise RuntimeError("this Ray worker was placed without a GPU (ray.get_gpu_ids() is empty)")
    gpu = str(gpu_ids[0]).strip()
    if visible is None:
        return int(gpu)
    order = [entry.strip() for entry in visible.split(",")]
    if gpu not in order:
        raise RuntimeError(f"Ray assigned GPU {gpu}, which CUDA_VISIBLE_DEVICES={visible!r} does not list")
    return order.index(gpu)


def prepare_deepspeed(device: torch.device) -> None:
    """Point DeepSpeed at the right accelerator and keep its logging to warnings."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.type == "cuda" else "cpu")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_loopback(host: str | None) -> bool:
    """Whether `host` is this machine's loopback address (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


_HOSTED: list = []  # the rendezvous sockets and stores this process serves, alive while it lives


def host_loopback_rendezvous(device: torch.device, rank: int, world_size: int) -> None:
    """Keep a rendezvous at MASTER_ADDR on the loopback address (all ranks on this machine: the
    local backend, a Ray instance hflow started) listening there only.

    torch's TCPStore server listens on every interface, whatever MASTER_ADDR says. Rank 0 serves
    the rendezvous from a socket bound to the loopback address (`master_listen_fd`); the process
    group's own store, multi-tenant on the same port (`torch.distributed.rendezvous`), reuses that
    server. Gloo's connections go over the loopback interface too (GLOO_SOCKET_IFNAME, unless set)."""
    import datetime

    import torch.distributed as dist

    if device.type == "cpu" and "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if rank != 0:
        return
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.bind((host, port))
    listener.listen(max(128, world_size))
    store = dist.TCPStore(host, port, world_size, True, datetime.timedelta(minutes=30), wait_for_workers=False,
                          multi_tenant=True, master_listen_fd=listener.fileno())
    _HOSTED.append((listener, store))


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
    if is_loopback(os.environ.get("MASTER_ADDR")):
        host_loopback_rendezvous(device, rank, world_size)
    # DeepSpeed puts its engine on cuda:LOCAL_RANK, and NCCL binds the communicator to the current
    # device, so both must be this rank's GPU before init: its index in this process (Ray's
    # assignment: `cuda_index`), not the global rank.
    local = rank
    if device.type == "cuda":
        if device.index is not None:
            torch.cuda.set_device(device)
        local = torch.cuda.current_device()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local))
    import deepspeed

    if device.type == "cpu":
        build_cpu_comm_op()
    # DeepSpeed's CPU backend prints "DeepSpeed deepspeed_shm_comm_op built successfully" on stdout
    # as it loads that op, verbose=False or not: a line in every CPU run's output that says nothing.
    with contextlib.redirect_stdout(io.StringIO()):
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo",
                                   verbose=False)
    atexit.register(leave_process_group)


def leave_process_group() -> None:
    """Tear down this process's group before the interpreter exits: a group still alive at exit
    leaks its communicators, and NCCL says so on every GPU run's stderr ("destroy_process_group()
    was not called before program exit", seen on each `hflow train` of the first H100 runs). The
    teardown is local to the rank (no collective), so a rank exiting on an error cannot hang in it."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


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
