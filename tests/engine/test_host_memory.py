"""The `hflow` command keeps freed host memory for the next pass (`engine/host_memory.py`)."""

import os
import platform
import subprocess
import sys

import pytest

from hflow.engine.host_memory import HOST_MEMORY_KEYS, TRIM_THRESHOLD, keep_host_memory


def test_the_settings_go_to_the_processes_it_starts_unless_the_user_chose_them():
    env: dict[str, str] = {}
    keep_host_memory(env)
    assert env == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}  # no huge pages
    env = {"MALLOC_TRIM_THRESHOLD_": "0", "THP_MEM_ALLOC_ENABLE": "1"}
    keep_host_memory(env)
    assert env == {"MALLOC_TRIM_THRESHOLD_": "0", "THP_MEM_ALLOC_ENABLE": "1", "MALLOC_MMAP_MAX_": "0"}


# Twice 20 buffers of 8 MiB and 4 of 48 MiB (above glibc's largest mmap threshold, as the LM
# head's logits are), each written, then all freed (as a pass's activations are): the page faults
# of the second round (`second_round_faults`), which finds its memory already faulted in only if
# the first round's was kept.
FAULTS = """
import resource, sys
if sys.argv[1] == "hflow":
    import hflow.cli
    assert "torch" not in sys.modules, "torch loaded first"
import torch
def one_round():
    buffers = [torch.empty(2 << 20).fill_(1.0) for _ in range(20)]
    buffers += [torch.empty(12 << 20).fill_(1.0) for _ in range(4)]
    del buffers
"""


def second_round_faults(script: str, mode: str, env: dict) -> int:
    """The page faults of the second of two runs of `script`'s `one_round()`, in a fresh process
    ("hflow": the command's module imported first)."""
    counted = script + """one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
one_round()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    done = subprocess.run([sys.executable, "-c", counted, mode], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings")
def test_a_second_pass_reuses_the_memory_the_first_freed():
    # Huge pages off in both, whatever this process was given: fewer faults from them would hide the reuse.
    env = {**{k: v for k, v in os.environ.items() if k not in HOST_MEMORY_KEYS}, "THP_MEM_ALLOC_ENABLE": "0"}
    faults = {mode: second_round_faults(FAULTS, mode, env) for mode in ("plain", "hflow")}
    # Without: the freed 352 MiB go back to the system and all 90,112 pages fault in again (measured
    # 90,114); with: they stay in the heap (18,432 measured).
    assert faults["plain"] > 45_000, faults
    assert faults["hflow"] < faults["plain"] / 2, faults


# 160 buffers of 8 MiB from glibc's malloc, each written, then all freed: a large pass's 1.25 GiB
# (SmolLM2's update frees more than 1 GiB at once), which comes back to the heap's top. The page
# faults of a second round: none where the heap kept it, every page (327,680) where it was trimmed.
TRIMMED = """
import ctypes, resource, sys
if sys.argv[1] == "hflow":
    import hflow.cli
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def one_round():
    buffers = [libc.malloc(8 << 20) for _ in range(160)]
    for b in buffers:
        ctypes.memset(b, 1, 8 << 20)
    for b in buffers:
        libc.free(b)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings")
def test_a_pass_that_frees_more_than_a_gibibyte_keeps_it_in_the_heap():
    base = {k: v for k, v in os.environ.items() if k not in HOST_MEMORY_KEYS}
    started: dict[str, str] = {}
    keep_host_memory(started)  # what a process the command starts is given
    runs = {"the 1 GiB threshold of 2026-11-27": ("plain", {"MALLOC_MMAP_MAX_": "0",
                                                             "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}),
            "the command itself": ("hflow", {}), "a process it starts": ("plain", started)}
    faults = {name: second_round_faults(TRIMMED, mode, {**base, **keys}) for name, (mode, keys) in runs.items()}
    assert faults["the 1 GiB threshold of 2026-11-27"] > 300_000, faults  # measured 327,649
    assert faults["the command itself"] < 20_000, faults
    assert faults["a process it starts"] < 20_000, faults
