"""How hflow's host memory is kept between passes: large buffers reused, not mapped afresh.

A step on the CPU allocates and frees the same large buffers over and over: a layer's
activations, a chunk of the log-softmax, the LM head's logits and their gradient. glibc's malloc
serves a buffer above its mmap threshold (128 KiB at first, rising with what is freed, to 32 MiB
at most) with a fresh mapping, and gives freed memory at its heap's top back to the system beyond
its trim threshold; the next pass then faults on every 4 KiB page it touches, and the kernel
zeroes each. On the 2-core development machine that was a fifth of an update's time in the
kernel (docs/benchmarks.md, "Host memory"). So the command (`cli/__init__.py`) and the Python API
(`trainer/api/__init__.py`) set, before torch loads, MALLOC_MMAP_MAX_ = 0 and a trim threshold
no heap reaches (`TRIM_THRESHOLD`), for the processes it starts (glibc reads them when a process
starts) and through `mallopt` for itself (where -1 turns trimming off): every buffer comes from the
heap, and what a pass frees stays there for the next. A user's own value of either wins. What is
freed stays with the process: its resident size stays at the peak it reaches every step (on
SmolLM2's update, 5.6 GB against 5.3 with glibc's defaults for large buffers), and memory freed
inside the heap is reused, not returned. Only glibc reads these keys; elsewhere they do nothing.

Huge pages for torch's buffers (`THP_MEM_ALLOC_ENABLE=1`) are left off. They were set here too
until 2026-11-27, but with the heap reused the faults they save happen once, and each costs more
(the kernel zeroes a whole 2 MiB page, and compacts memory to find one): a first touch of 1 GiB in
8 MiB buffers took 373-1,214 ms with them against 188-210 without (`benchmarks/first_touch.py`),
the 3.5M model's first update 0.62-0.67 s against 0.45, and the steady steps were no faster
(docs/benchmarks.md, "Host memory").
"""

from __future__ import annotations

import ctypes
import os
import platform

# A step frees more than 1 GiB at once where its passes are large: SmolLM2's update of 1,500 tokens
# gave back its heap's top every few steps under the 1 GiB threshold of 2026-11-27, each time
# faulting 1.2 GB in again (about 300,000 pages, 1.2-2.2 s in the kernel) with its resident size no
# higher; with trimming off, a step faults pages in only where it reaches a new peak
# (docs/benchmarks.md, "Host memory").
TRIM_THRESHOLD = 1 << 62
HOST_MEMORY_KEYS = {"MALLOC_MMAP_MAX_": 0, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD}
# The keys' `mallopt` parameters (malloc.h) and values: an int each; -1 turns trimming off.
_MALLOPT = {"MALLOC_MMAP_MAX_": (-4, 0), "MALLOC_TRIM_THRESHOLD_": (-1, -1)}


def keep_host_memory(environ: dict | None = None) -> None:
    """Set the two keys above in `environ` (default: the process's, where glibc's own settings are
    also made now) unless the user set them."""
    env = os.environ if environ is None else environ
    ours = {key: value for key, value in HOST_MEMORY_KEYS.items() if key not in env}
    env.update({key: str(value) for key, value in ours.items()})
    if environ is None and platform.libc_ver()[0] == "glibc":
        libc = ctypes.CDLL(None)
        for key in ours:
            if key in _MALLOPT:
                libc.mallopt(*_MALLOPT[key])
