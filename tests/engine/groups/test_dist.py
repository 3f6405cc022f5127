"""Process-group set-up: DeepSpeed's CPU op builds even after a process died inside its build."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
