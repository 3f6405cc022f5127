"""Reward functions that fail on purpose at step 2, for the worker-failure tests.

The first call scores normally; the second raises (or kills its own process).
"""

import os
import signal

from hflow.trainer.data.rewards import synthetic

_calls = {"n": 0}


def raises_at_second_call(prompts, responses, **columns):
    _calls["n"] += 1
    if _calls["n"] >= 2:
        raise ValueError("the reward service is down")
    return synthetic(prompts, responses, **columns)


def dies_at_second_call(prompts, responses, **columns):
    _calls["n"] += 1
    if _calls["n"] >= 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return synthetic(prompts, responses, **columns)
