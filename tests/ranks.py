"""The multi-rank tests' processes (importable as `ranks`), started with torch.multiprocessing's spawn.

Each rank writes its stderr, and faulthandler's Python stacks of every thread at a fatal signal, to
`rank-N.stderr` in the test's directory. A rank that dies on a signal fails the test with that
file's end, so a crash says where it happened (pytest's report of a spawned process says only
"terminated with signal SIGABRT").

A rank that finishes tears its process group down and leaves with `os._exit`, without the
interpreter's teardown. `destroy_process_group` does not end gloo's worker and socket threads
(checked: four `pt_gloo_runloop` and two `gloo_tcp_loop` threads still run after it and a garbage
collection): DeepSpeed's engines and its ZeRO-3 parameters keep the group object alive
(`ds_process_group`, `dp_process_group`), so a normal exit destroys it during finalization, while
those threads still run and the interpreter is half gone. A C++ thread that then touches a Python
object aborts the process: SIGABRT, 'terminate called without an active exception', seen in CI
after `test_two_ranks_receive_the_trained_weights_bitwise[3]` had passed; a later SIGABRT of
`test_two_ranks_resume_exactly[3-float32]` printed no more than the signal, which is why the
stderr file exists. Everything a rank reports is written to files before it leaves."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

TAIL_CHARS = 4000  # of a dead rank's stderr, in the failure


def spawn(fn: Callable, world_size: int, out_dir: Path, *args) -> None:
    """Run `fn(rank, world_size, *args)` in `world_size` spawned processes and wait for all of them."""
    import torch.multiprocessing as mp

    try:
        mp.start_processes(_rank, nprocs=world_size, start_method="spawn", join=True,
                           args=(fn, str(out_dir), world_size, *args))
    except mp.ProcessExitedException as died:
        log = Path(out_dir) / f"rank-{died.error_index}.stderr"
        tail = log.read_text(errors="replace")[-TAIL_CHARS:] if log.exists() else "(no stderr file)"
        raise AssertionError(f"rank {died.error_index} died ({died.signal_name or died.exit_code}); "
                             f"the end of {log}:\n{tail}") from None


def _rank(rank: int, fn: Callable, out_dir: str, world_size: int, *args) -> None:
    import faulthandler

    stderr = open(Path(out_dir) / f"rank-{rank}.stderr", "w", buffering=1)
    os.dup2(stderr.fileno(), 2)
    faulthandler.enable(file=stderr, all_threads=True)
    fn(rank, world_size, *args)
    _leave()
    sys.stdout.flush()
    sys.stderr.flush()
    stderr.flush()
    os._exit(0)


def _leave() -> None:
    """Every rank past its last collective, then the group torn down (locally)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
