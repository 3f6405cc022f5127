"""The local backend's watchdog on user code (`engine/watched_call.py`): a call still running at its
timeout is stopped there, however it waits, with one line naming it; a call that ends in time, or
raises, is untouched, and the process's signal handling is as it was."""

import signal
import threading
import time

import pytest

from hflow.engine.watched_call import SIGNAL, watched
from hflow.errors import RunFailed


def _spin():
    while True:
        pass


@pytest.mark.parametrize("wait", [lambda: time.sleep(60), lambda: threading.Event().wait(), _spin],
                         ids=["sleep", "lock", "python-loop"])
def test_a_call_still_running_at_its_timeout_is_stopped_in_one_line(wait):
    before = signal.getsignal(SIGNAL)
    finished = []

    def call():
        wait()
        finished.append(True)

    with pytest.raises(RunFailed, match=r"^reward\.function 'm:f' gave no answer within 0\.5 s "
                                        r"\(trainer\.worker_timeout_s\): it hangs"):
        watched(call, "reward.function 'm:f'", 0.5)
    assert finished == []  # stopped while it waited, not after the call's own 60 s (nor never)
    assert signal.getsignal(SIGNAL) is before


def test_a_call_that_swallows_the_interrupt_is_still_reported():
    def stubborn():
        try:
            time.sleep(60)
        except BaseException:
            return [1.0]

    with pytest.raises(RunFailed, match="gave no answer within 0.2 s"):
        watched(stubborn, "reward.function 'm:f'", 0.2)


def test_calls_in_time_or_raising_are_untouched_and_may_use_their_own_alarm():
    def with_alarm():  # a reward function with its own signal-based timeout, as some math checkers have
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("own alarm")))
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        try:
            time.sleep(5)
        except TimeoutError:
            return "own timeout"
        finally:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

    assert watched(lambda: [0.5], "f", 5) == [0.5]
    assert watched(with_alarm, "f", 5) == "own timeout"
    with pytest.raises(ValueError, match="down"):
        watched(lambda: (_ for _ in ()).throw(ValueError("down")), "f", 5)
    time.sleep(0.3)  # no late interrupt from a timer of the calls above
