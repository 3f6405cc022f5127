"""hflow from Python: `train`, `evaluate`, `compare` and the `Run` they leave. The CLI is a shell over
the same steps (`launch.py`). Published as `hflow.train`, `hflow.evaluate`, `hflow.compare`, `hflow.Run`.

Importing it (the first `hflow.train` does) makes the command's process settings, so that a run
from Python is as fast as `hflow train`: how idle OpenMP threads wait (`engine/cpu_threads.py`) and
how freed host memory is kept (`engine/host_memory.py`). Where torch was imported first, the
thread setting reaches only the processes started afterwards (workers, ranks); the malloc settings
take effect in this process too. A user's own value of any of them wins."""

from hflow.engine.cpu_threads import choose_spin
from hflow.engine.host_memory import keep_host_memory

choose_spin()
keep_host_memory()
