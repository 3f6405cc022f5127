"""Command-line interface: one module per command.

Importing it sets how idle OpenMP threads wait, before torch is loaded (`cpu_threads.py`).
"""

from hflow.cli.cpu_threads import wait_passively

wait_passively()
