"""Stop signals: SIGTERM takes Ctrl-C's path (an exception in the main thread), with its own
one-line message and exit code 128 + the signal's number."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hflow.trainer.control.session import failure_message
from hflow.trainer.stop import Terminated, stop_exit_code, stop_signals


def test_sigterm_raises_terminated_inside_the_block_and_the_old_handler_returns():
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals():
        with pytest.raises(Terminated) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode; this is never finished
    assert signal.getsignal(signal.SIGTERM) == before
    assert failure_message(stopped.value) == "terminated (SIGTERM)"
    assert stop_exit_code(stopped.value) == 143


def test_ctrl_c_keeps_its_message_and_exits_130():
    assert failure_message(KeyboardInterrupt()) == "interrupted"
    assert stop_exit_code(KeyboardInterrupt()) == 130


def test_a_stop_wrapped_by_a_c_extension_is_still_a_stop():
    """The handler raises inside whatever the main thread runs; a C extension interrupted there
    (Ray's `ray.wait`, seen in a full suite run) fails with its own SystemError whose context is
    the stop: the run is still stopped (exit 143, its one line), not failed with a traceback."""
    from hflow.trainer.stop import is_stop, stop_message

    try:
        try:
            raise Terminated(signal.SIGTERM)
        except Terminated:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set")
    except SystemError as wrapped:
        assert is_stop(wrapped) and stop_exit_code(wrapped) == 143
        assert stop_message(wrapped) == "terminated (SIGTERM)" == failure_message(wrapped)
    assert not is_stop(SystemError("a real failure"))
