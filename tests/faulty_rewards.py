"""Reward functions that fail on purpose, for the worker-failure and bad-score tests.

The `*_at_second_call` ones score normally at the first call (step 1) and fail at the second
(step 2): raise, kill their own process, or return a NaN. `_calls` counts calls per process;
an in-process test resets it.
"""

import os
import signal
import time

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


def one_nan_at_second_call(prompts, responses, **columns):
    """Step 2's first score is NaN, the rest as `synthetic` scores them."""
    _calls["n"] += 1
    scores = synthetic(prompts, responses, **columns)
    if _calls["n"] == 2:
        scores[0] = float("nan")
    return scores


def returns_none(prompts, responses, **columns):
    return None


def constant(prompts, responses, **columns):
    """The same score for every response: every group's rewards are equal (DAPO drops them all)."""
    return [1.0] * len(responses)


def slow(prompts, responses, **columns):
    """`synthetic`, a third of a second late: a run slow enough for a test to act between its steps."""
    time.sleep(0.3)
    return synthetic(prompts, responses, **columns)


def held_from_third_call(prompts, responses, **columns):
    """`synthetic`; from the third call of its process on, it waits while the file named by
    REWARD_HOLD_FILE exists: a run a test holds in its third step (to kill a node under it)."""
    _calls["n"] += 1
    hold = os.environ.get("REWARD_HOLD_FILE")
    while _calls["n"] >= 3 and hold and os.path.exists(hold):
        time.sleep(0.1)
    return synthetic(prompts, responses, **columns)


def hangs_at_second_call(prompts, responses, **columns):
    """Step 2's call never returns, as a reward service that stopped answering."""
    _calls["n"] += 1
    if _calls["n"] >= 2:
        time.sleep(3600)
    return synthetic(prompts, responses, **columns)
