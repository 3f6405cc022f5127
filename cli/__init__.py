"""Command-line interface: one module per command.

Importing it sets how idle OpenMP threads wait (`engine/cpu_threads.py`) and how host memory is
kept between passes (`engine/host_memory.py`), before torch is loaded (as the Python API does:
`trainer/api/__init__.py`).
"""

from hflow.engine.cpu_threads import choose_spin
from hflow.engine.host_memory import keep_host_memory

choose_spin()
keep_host_memory()
