"""The `hflow` command's OpenMP waiting policy (`engine/cpu_threads.py`)."""

import os
import subprocess
import sys

from hflow.engine.cpu_threads import SPIN_COUNT, spin_briefly


def test_idle_threads_spin_briefly_unless_the_user_chose_a_policy():
    env: dict[str, str] = {}
    spin_briefly(env)
    assert env == {"GOMP_SPINCOUNT": SPIN_COUNT}
    for user in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "10000"}):
        env = dict(user)
        spin_briefly(env)
        assert env == user


def test_the_policy_is_set_before_torch_loads():
    # libgomp reads GOMP_SPINCOUNT once, when it starts: the command must set it first.
    code = ("import os, sys; import hflow.cli; assert 'torch' not in sys.modules, 'torch loaded first'; "
            "import torch; torch.ones(2) @ torch.ones(2); print(os.environ['GOMP_SPINCOUNT'])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == SPIN_COUNT
