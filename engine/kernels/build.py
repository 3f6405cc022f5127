"""Compiling a kernel's C source on first use, and loading it from the user's own cache.

A kernel is one C file beside this module (`decode_attention.c`, `layers.c`; with the headers
here), built into a shared library with the host's C compiler, its vector instructions
(`-march=native`) and OpenMP, and loaded with ctypes: no build step at install, no torch headers
(a build takes about a third of a second). It links the OpenMP runtime torch has already loaded
(its own copy of libgomp), so that the kernel's threads are torch's threads: a second runtime would
start a second team of spinning threads on the same cores.

The library goes to `$XDG_CACHE_HOME/hflow/kernels` (`~/.cache/hflow/kernels`), named by a hash of
everything that shapes it: the source and headers, the flags, the compiler's version, the CPU's
model and flags (a home directory shared by machines of different CPUs keeps one build per CPU),
the OpenMP runtime's path. A library is code this process will run, so the folder must be the user's
own and writable by no one else, and so must the file (`user_cache.py`, checked before each load; built to a
temporary name and renamed into place, so that processes building at once never load half a file).

Where there is no C compiler, no libgomp in the process (a torch built with another OpenMP), a
folder or file someone else could have written, or a failed build, `load` answers None and says
why once: the caller keeps its torch path. `HFLOW_CPU_KERNELS=off` turns every kernel off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from hflow.engine import user_cache
from hflow.errors import UserError

log = logging.getLogger(__name__)

ENV = "HFLOW_CPU_KERNELS"
SOURCES = Path(__file__).parent
# -fno-trapping-math lets floorf become a vector instruction, and so the exponentials' loops
# vectorize (`vector_math.h`): no kernel reads the floating-point exception flags.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math"]
BUILD_SECONDS = 120


class Unavailable(Exception):
    """Why a kernel cannot be used here (said once, in the log)."""


class KernelSettingError(UserError):
    """HFLOW_CPU_KERNELS is neither on nor off."""


def enabled() -> bool:
    """HFLOW_CPU_KERNELS: "on" (the default, also when empty) or "off"."""
    value = os.environ.get(ENV, "on").strip().lower() or "on"
    if value not in ("on", "off"):
        raise KernelSettingError(f"environment {ENV}={os.environ[ENV]!r}: accepted values are on, off")
    return value == "on"


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The kernel `name` (`name.c` here), built if this CPU has no build of it yet; None where it
    cannot be used (`enabled`, `Unavailable`), said once."""
    if not enabled():
        return None
    try:
        return ctypes.CDLL(str(_library(name)))
    except (Unavailable, user_cache.NotOwn, OSError) as err:
        log.info("the %s kernel is not used, the torch path is: %s", name, err)
        return None


def wrapped(name: str, wrapper: type):
    """`wrapper(library)` for the kernel `name` (its ctypes calls declared once per process), or None
    where `load` gives no library."""
    library = load(name)
    return None if library is None else _wrap(wrapper, library)


@functools.cache
def _wrap(wrapper: type, library: ctypes.CDLL):
    return wrapper(library)


def compiler() -> str:
    """The C compiler kernels are built with: $CC, else cc or gcc on PATH."""
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if found is None:
        raise Unavailable("no C compiler (cc, gcc or $CC) on PATH")
    return found


def _library(name: str) -> Path:
    source = SOURCES / f"{name}.c"
    compiler_path = compiler()
    openmp = openmp_runtime()
    version = _run([compiler_path, "--version"], "the compiler's --version").splitlines()[0]
    headers = [h.read_text() for h in sorted(SOURCES.glob("*.h"))]  # included by the sources
    key = "\n".join([source.read_text(), *headers, " ".join(FLAGS), version, user_cache.cpu_identity(),
                     str(openmp)])
    folder = user_cache.folder("kernels")
    library = folder / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    if not library.exists():
        fd, partial = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".so")
        os.close(fd)
        try:
            _run([compiler_path, *FLAGS, str(source), "-o", partial, str(openmp), f"-Wl,-rpath,{openmp.parent}", "-lm"],
                 f"building {source.name}")
            os.chmod(partial, 0o755)
            os.replace(partial, library)
        finally:
            Path(partial).unlink(missing_ok=True)
    user_cache.check_own(library)
    return library


def openmp_runtime() -> Path:
    """The OpenMP runtime torch's kernels run on: the libgomp that torch's library names, as this
    process has it loaded (found by that name, as the loader finds it; a process can hold other
    copies: sentencepiece brings its own)."""
    import torch

    needed = _run(["readelf", "-d", str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")],
                  "reading torch's library")
    names = re.findall(r"\(NEEDED\)\s+Shared library: \[(libgomp[^\]]*)\]", needed)
    if not names:
        raise Unavailable("torch's kernels do not run on libgomp")
    try:
        runtime = ctypes.CDLL(names[0], mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError as err:
        raise Unavailable(f"torch's OpenMP runtime {names[0]} is not loaded ({err})") from None
    return library_of(ctypes.cast(runtime.omp_get_max_threads, ctypes.c_void_p).value)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_of(address: int) -> Path:
    """The file of the loaded library that holds this code address (`dladdr`)."""
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        raise Unavailable(f"no loaded library holds address {address:#x}")
    return Path(os.fsdecode(info.dli_fname)).resolve()


def _run(command: list[str], what: str) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise Unavailable(f"{what} failed: {err}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise Unavailable(f"{what} failed (exit {done.returncode}): {' | '.join(tail)}")
    return done.stdout
