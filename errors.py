"""The exception types whose message is all a person needs: one line, no traceback.

A UserError is a mistake a user can fix in what they gave hflow: the recipe, paths, data, or
their own reward or cost function (it raised, returned something that is not one number per
response, or returned NaN/inf). The CLI prints `error: <message>` and exits 2, on every backend.

A MachineError is the machine stopping a run (a full disk, a folder that cannot be written):
one line like a UserError, exit 1.

A RunFailed is a run that could not go on for a reason that is not the user's input: a worker's
process died, hflow raised inside a worker, the training diverged (a non-finite loss or
gradient norm). The CLI prints `error: <message> (run directory: ...)`, keeps the traceback in
train.log and exits 1. Any other exception is a bug and keeps its full traceback.
"""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, for a one-line report."""
    return (str(err).strip().splitlines() or [""])[0]


class UserError(Exception):
    """A mistake in the user's input (recipe, paths, data, reward code), reported in one line."""

    exit_code = 2


class MachineError(UserError):
    """The machine, not the input, stopped the run (a full disk, a folder that cannot be
    written): reported in one line like a UserError, with exit code 1."""

    exit_code = 1


class RunFailed(RuntimeError):
    """The run stopped for a reason named in one line (a worker died, training diverged)."""

    exit_code = 1
