"""How hflow's host memory is kept between passes: large buffers reused, not mapped afresh.

A step on the CPU allocates and frees the same large buffers over and over: a layer's
activations, a chunk of the log-softmax, the LM head's logits. glibc's malloc serves a buffer
above its mmap threshold (128 KiB at first, rising with what is freed, to 32 MiB at most) with a
fresh mapping, and gives freed memory at its heap's top back to the system beyond its trim
threshold; the next pass then faults on every 4 KiB page it touches, and the kernel zeroes each.
On the 2-core development machine that was a quarter of an update's time in the kernel
(docs/benchmarks.md, "Host memory"). So the command, before torch loads:

- MALLOC_MMAP_THRESHOLD_ = 32 MiB (glibc's largest) and MALLOC_TRIM_THRESHOLD_ = 1 GiB, for the
  processes it starts (glibc reads them when a process starts) and through `mallopt` for itself:
  buffers up to 32 MiB come from the heap and freed ones stay there for the next pass;
- THP_MEM_ALLOC_ENABLE=1: torch aligns CPU buffers of 2 MiB and more to huge pages and asks the
  kernel for them (`madvise`), one fault per 2 MiB where it grants them.

A user's own value of any of these wins. What is freed stays with the process, up to 1 GiB at
the heap's top: its resident size stays near the peak it reaches every step anyway. Only glibc
reads the MALLOC_ keys; elsewhere they do nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_host_memory(environ: dict | None = None) -> None:
    """Set the keys above in `environ` (default: the process's, where glibc's own thresholds are
    also set now) unless the user set them."""
    env = os.environ if environ is None else environ
    chosen = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD,
              "THP_MEM_ALLOC_ENABLE": 1}
    ours = {key: value for key, value in chosen.items() if key not in env}
    env.update({key: str(value) for key, value in ours.items()})
    if environ is None and platform.libc_ver()[0] == "glibc":
        libc = ctypes.CDLL(None)
        if "MALLOC_MMAP_THRESHOLD_" in ours:
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        if "MALLOC_TRIM_THRESHOLD_" in ours:
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
