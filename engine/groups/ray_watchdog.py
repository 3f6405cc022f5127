"""The `ray` backend's watchdog: how the controller waits for worker calls, and whom it names.

Every wait for results goes through `get_parts`. The pieces it waits for are awaited together
(`ray.wait`), whatever their rank: the first to fail is reported as soon as it fails, even while
another rank of its group still waits for it in a collective. When nothing it waits for answers
within `trainer.worker_timeout_s` it fires once, at that time, and names the call that stalled:
not the one waited for, but the first call down its inputs (`Part.deps`: the calls that produce
what it reads, a streamed chunk's producer among them) that has not answered while its own
inputs have. A call that failed because an input did is reported as that input's failure.
"""

from __future__ import annotations

import os
from typing import Any

from hflow.engine.groups.worker import WorkerError
from hflow.errors import UserError

STALLED = "the process is stalled or the call hangs"


def ray_module():
    # Ray's C++ failure-signal handler (absl; in the driver, and in the workers of a Ray instance
    # started from here, which inherit the variable) catches SIGTERM as well as crashes and
    # prints a C stack dump on screen. Ray's switch for it is this variable, read when ray is
    # first imported. Python's faulthandler, which Ray enables, still reports crashes, and a
    # SIGTERM reaches Python's handler: the controller stops cleanly.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    import ray

    return ray


class InputFailed(Exception):
    """Raised in a worker whose call could not read an input another call was to produce (that
    call raised, or its process died): the fault is upstream, not in this worker."""


class UpstreamFailed(WorkerError):
    """A call that failed only because one of its inputs did (`InputFailed`). Readers name the
    input's failure instead where they find it (`get_parts`)."""


def get_result(ref, role: str, rank: int, call: str = "", timeout_s: float | None = None):
    """The value of one worker call. A worker that raised, died, or (the watchdog) gave no answer
    within `timeout_s` becomes a WorkerError naming its role, rank and call."""
    ray = ray_module()
    died = "its process died (killed, crashed or out of memory)"
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise _no_answer(role, rank, call, timeout_s) from None
    except ray.exceptions.RayTaskError as err:
        cause = err.cause if getattr(err, "cause", None) is not None else err
        if isinstance(cause, ray.exceptions.RayActorError):
            raise WorkerError(role, rank, died) from None
        if isinstance(cause, UserError):  # the user's mistake, found in a worker: the same line as on local
            raise UserError(str(cause)) from None
        if isinstance(cause, InputFailed):
            raise UpstreamFailed(role, rank, f"an input of {call or 'a call'} failed ({cause})") from None
        first_line = (str(cause).strip().splitlines() or [""])[0]
        raise WorkerError(role, rank, f"{type(cause).__name__}: {first_line}") from None
    except ray.exceptions.RayActorError:
        raise WorkerError(role, rank, died) from None


def _no_answer(role: str, rank: int, call: str, timeout_s: float | None) -> WorkerError:
    return WorkerError(role, rank, f"no answer to {call or 'a call'} within {timeout_s:g} s "
                                   f"(trainer.worker_timeout_s): {STALLED}")


def get_parts(parts: list) -> list:
    """The value of every piece, in order, all awaited at once. The watchdog's clock restarts
    whenever one answers: it fires when none has for `timeout_s` (the pieces' own; None waits
    for ever), naming the call that stalled (`_stalled`). A failure raises at once (`_failure`)."""
    ray = ray_module()
    values: list = [None] * len(parts)
    pending: dict[Any, list[int]] = {}  # a ref may be several parts: cuts of one piece (`Cut`)
    for i, part in enumerate(parts):
        if part.local is not None:
            values[i] = part.local
        else:
            pending.setdefault(part.ref, []).append(i)
    timeout_s = next((p.timeout_s for p in parts if p.local is None), None)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout_s, fetch_local=False)
        if not ready:
            stalled = _stalled(parts[next(iter(pending.values()))[0]])
            raise _no_answer(stalled.role, stalled.rank, stalled.call, timeout_s)
        for ref in ready:
            where = pending.pop(ref)
            part = parts[where[0]]
            try:
                value = get_result(ref, part.role, part.rank, part.call, part.timeout_s)
            except (WorkerError, UserError) as err:
                raise _failure(part, err) from None
            for i in where:
                values[i] = value
    return values


def _ready(part) -> bool:
    if part.local is not None:
        return True
    ready, _ = ray_module().wait([part.ref], num_returns=1, timeout=0, fetch_local=False)
    return bool(ready)


def _stalled(part):
    """The call that holds up `part`: the first of its inputs' producers, depth first, that has not
    answered while everything it reads has; `part` itself when all its inputs are in."""
    for dep in getattr(part, "deps", ()):
        if not _ready(dep):
            return _stalled(dep)
    return part


def _failure(part, err: Exception) -> Exception:
    """What to report for `part`, which raised `err`: the failure of an input it read, where one of
    them failed (its producer is at fault, not the reader), else `err`."""
    for dep in getattr(part, "deps", ()):
        if dep.local is None and _ready(dep):
            try:
                get_result(dep.ref, dep.role, dep.rank, dep.call, dep.timeout_s)  # in: no wait
            except (WorkerError, UserError) as dep_err:
                return _failure(dep, dep_err)
    return err
