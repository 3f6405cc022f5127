"""Command-line interface: one module per command.

Importing it sets how idle OpenMP threads wait (`cpu_threads.py`) and how host memory is kept
between passes (`host_memory.py`), before torch is loaded.
"""

from hflow.cli.cpu_threads import spin_briefly
from hflow.cli.host_memory import keep_host_memory

spin_briefly()
keep_host_memory()
