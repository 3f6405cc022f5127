"""A watchdog for user code called in hflow's own process: the local backend's reward and cost
functions (`workers/function_scores.py`).

On the ray backend the controller watches every worker call from outside (`groups/ray_watchdog.py`);
on the local backend the call runs in the controller's process, so a hung function would hold the
run with no message. `watched` runs the call on the calling thread, as before (a function that
sets its own `signal.alarm` keeps working), while a timer thread waits `timeout_s`: if the call is
still running then, the timer sends the main thread a signal whose handler raises inside it, which
also ends a blocking wait (sleep, socket, lock, subprocess). The run stops with one line naming
the function and the timeout (a RunFailed: exit 1, as the ray backend's watchdog).

The signal is SIGURG, whose default action is to be ignored, so a signal still in flight when the
call ends harms nothing. Only the main thread receives Python's signal handlers: called from
another thread, the function runs unwatched. Code stuck in C without releasing the GIL cannot be
interrupted by any Python means.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable, TypeVar

from hflow.errors import RunFailed

T = TypeVar("T")
SIGNAL = signal.SIGURG


class _Overdue(BaseException):
    """Raised inside the watched call at its timeout; a BaseException, so that the user's
    `except Exception` does not swallow it."""


def watched(call: Callable[[], T], what: str, timeout_s: float | None) -> T:
    """`call()`; if it has not returned after `timeout_s` seconds (None: no watchdog), a RunFailed
    naming `what`, e.g. "reward.function 'mod:fn'"."""
    if not timeout_s or threading.current_thread() is not threading.main_thread():
        return call()
    main, lock = threading.main_thread().ident, threading.Lock()
    state = {"running": True, "fired": False}

    def fire() -> None:
        with lock:
            if state["running"]:
                state["fired"] = True
                signal.pthread_kill(main, SIGNAL)

    def interrupt(signum, frame) -> None:
        if state["running"] and state["fired"]:
            raise _Overdue

    previous = signal.signal(SIGNAL, interrupt)
    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    try:
        try:
            result = call()
        finally:
            state["running"] = False  # from here on the handler raises nothing
    except _Overdue:
        pass
    finally:
        with lock:  # a send in progress has finished: none comes after
            timer.cancel()
        signal.signal(SIGNAL, previous)
    if state["fired"]:
        raise RunFailed(f"{what} gave no answer within {timeout_s:g} s (trainer.worker_timeout_s): it hangs "
                        "(a service it waits for, a loop that does not end); the run stopped")
    return result
