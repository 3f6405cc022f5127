"""Kernels in C for a CPU's hot loops that eager torch runs as many small library calls, compiled
on first use for this CPU (`build.py`) and called with ctypes; each beside the torch path it
replaces, which stays where the kernel cannot be built."""
