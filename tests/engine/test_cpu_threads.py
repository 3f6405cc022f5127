"""The `hflow` command's OpenMP waiting policy (`engine/cpu_threads.py`)."""

import os
import subprocess
import sys

import pytest

from hflow.engine.cpu_threads import FIXED_TEAM_SPIN, SHRINKING_TEAM_SPIN, choose_spin


def test_a_fixed_team_spins_briefly_a_shrinking_one_long_unless_the_user_chose_a_policy():
    assert int(FIXED_TEAM_SPIN) < int(SHRINKING_TEAM_SPIN)
    env: dict[str, str] = {}
    choose_spin(env)
    assert env == {"GOMP_SPINCOUNT": SHRINKING_TEAM_SPIN}  # cpu_share.py shrinks the team
    env = {"OMP_NUM_THREADS": "2"}
    choose_spin(env)
    assert env == {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": FIXED_TEAM_SPIN}
    env = {}
    choose_spin(env, fixed_team=True)
    assert env == {"GOMP_SPINCOUNT": FIXED_TEAM_SPIN}
    for user in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "10000"},
                 {"GOMP_SPINCOUNT": "10000", "OMP_NUM_THREADS": "2"}):
        env = dict(user)
        choose_spin(env)
        assert env == user


@pytest.mark.parametrize("threads, spin", [(None, SHRINKING_TEAM_SPIN), ("2", FIXED_TEAM_SPIN)])
def test_the_policy_is_set_before_torch_loads(threads, spin):
    # libgomp reads GOMP_SPINCOUNT once, when it starts: the command must set it first.
    code = ("import os, sys; import hflow.cli; assert 'torch' not in sys.modules, 'torch loaded first'; "
            "import torch; torch.ones(2) @ torch.ones(2); print(os.environ['GOMP_SPINCOUNT'])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, **({"OMP_NUM_THREADS": threads} if threads else {})})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == spin
