"""Code a recipe names as `module:attr` (a reward or cost function, an environment class), imported
where it runs. `module` is a dotted module name on the import path, or a `.py` file by its path
(the recipe loader turns a module found beside the recipe or in the current folder into its
file's absolute path: `trainer/config/load.py`). A file's folder goes on the import path first,
so it imports its sibling modules as it would when run from there."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from hflow.errors import UserError, first_line


def import_named(spec: str, key: str, kind: str) -> object:
    """The object `attr` of `module:attr` (None when the module lacks it); a UserError naming the
    recipe `key` when `spec` is malformed or the module cannot be imported. `kind` says what the
    spec should name, e.g. "module:function", for the malformed case."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"{key} {spec!r}: not of the form {kind}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise UserError(f"{key} {spec!r}: no such file {str(path.absolute())!r}")
        folder = str(path.parent.resolve())
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module_name = path.stem
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UserError(f"{key} {spec!r}: cannot import module {module_name!r} ({err}); put {module_name}.py "
                        "beside the recipe or in the current folder, or name its file: path/to/file.py:NAME") from None
    except Exception as err:  # a SyntaxError, or anything the module raises while it loads
        raise UserError(f"{key} {spec!r}: importing module {module_name!r} raised "
                        f"{type(err).__name__}: {first_line(err)}") from err
    return getattr(module, attr, None)


# Python objects handed over in-process (`hflow.train(reward=fn)`), by the spec that names them in
# the recipe: `python:NAME`. The controller resolves them; workers receive the object itself in
# their spec (pickled by value to Ray workers), never the name.
REGISTERED: dict[str, object] = {}
REGISTERED_PREFIX = "python:"


def register(obj: object, name: str) -> str:
    """The spec `python:NAME` for `obj` in this process (NAME-2, ... when NAME is taken by another)."""
    spec, n = f"{REGISTERED_PREFIX}{name}", 1
    while REGISTERED.get(spec, obj) is not obj:
        n += 1
        spec = f"{REGISTERED_PREFIX}{name}-{n}"
    REGISTERED[spec] = obj
    return spec


def registered(spec: str, key: str) -> object | None:
    """The object a `python:` spec names, None for any other spec; a UserError for a `python:` spec
    this process was not given (a run started from Python, resumed from the command line)."""
    if not spec.startswith(REGISTERED_PREFIX):
        return None
    if spec not in REGISTERED:
        raise UserError(f"{key} {spec!r}: was a Python object handed to hflow.train in another process; give it "
                        "again (hflow.train(..., reward=fn)), or name it by its module: module:function")
    return REGISTERED[spec]
