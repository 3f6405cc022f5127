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
