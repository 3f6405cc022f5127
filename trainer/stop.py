"""Stopping a run from outside: Ctrl-C (SIGINT) and SIGTERM take one path.

SIGTERM is what `timeout`, `docker stop`, Kubernetes and Slurm send before they kill. Left
to Python's default it ends the process on the spot: no status, no log, workers orphaned.
`stop_signals()` turns it into a `Terminated` exception in the main thread, as Python
already turns SIGINT into KeyboardInterrupt, so both unwind the same way: the session
marks the run failed at its last step, the worker groups (and Ray) shut down, the last
complete checkpoint stays as it is, and `hflow train` exits 128 + the signal's number
(130, 143), the shell's convention for a process ended by a signal.

The handler also records the signal (`check_stop`): a long loop (loading and tokenizing prompts)
checks it at each item, so that it stops there even where the exception could not reach it (a
thread other than the main one, a library that catches BaseException).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


class Terminated(BaseException):
    """A stop signal other than SIGINT arrived. Not an Exception, like KeyboardInterrupt:
    no `except Exception` on the way may swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: list[int] = []  # stop signals received within `stop_signals()`, newest last


def _raise_terminated(signum: int, frame) -> None:
    _received.append(signum)
    raise Terminated(signum)


def check_stop() -> None:
    """Raise `Terminated` if a stop signal arrived within `stop_signals()`: the check of a loop
    that may take long (it costs one list lookup)."""
    if _received:
        raise Terminated(_received[-1])


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated`; the previous handler comes back after it.
    Call from the main thread (only it receives Python signal handlers)."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    _received.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _received.clear()


def the_stop(err: BaseException) -> BaseException | None:
    """The stop (Ctrl-C or a signal) `err` is or came from, else None. The handler raises where the
    main thread happens to be, also inside a C extension's call (`ray.wait`, say), which may then
    fail with an error of its own (a SystemError "returned a result with an exception set") whose
    context is the stop: that is still a stop, not a failure of the run."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, (KeyboardInterrupt, Terminated)):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def is_stop(err: BaseException) -> bool:
    """Whether `err` is a stop from outside (Ctrl-C or a signal), not a failure of the run."""
    return the_stop(err) is not None


def stop_message(err: BaseException) -> str:
    """The one line for a stop: `interrupted` for Ctrl-C, `terminated (SIGTERM)` for a signal."""
    stop = the_stop(err)
    if isinstance(stop, Terminated):
        return f"terminated ({signal.Signals(stop.signum).name})"
    return "interrupted"


def stop_exit_code(err: BaseException) -> int:
    """128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM."""
    stop = the_stop(err)
    return 128 + (stop.signum if isinstance(stop, Terminated) else signal.SIGINT)
