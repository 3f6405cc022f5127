"""The one exception type for mistakes a user can fix.

A UserError's message is a single line that names the file, the key or the value
and what would be accepted. The CLI prints it without a traceback and exits 2;
any other exception is a bug and keeps its full traceback.
"""


class UserError(Exception):
    """A mistake in the user's input (recipe, paths, data), reported in one line."""

    exit_code = 2


class MachineError(UserError):
    """The machine, not the input, stopped the run (a full disk, a folder that cannot be
    written): reported in one line like a UserError, with exit code 1."""

    exit_code = 1
