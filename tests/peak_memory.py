"""A process's peak resident memory over a block, from the kernel's own counter (used by
tests/engine/rollout/test_hybrid.py)."""

import resource


def _status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status (VmHWM, VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class PeakResident:
    """The peak resident memory of this process while the block ran, from the kernel's own
    high-water mark rather than from samples: a sampler that looks every millisecond misses a
    copy that appears and is freed between two looks, but the kernel raises the mark (VmHWM,
    the same counter getrusage's ru_maxrss reports) before it lets resident pages go, so no
    peak in the block can be missed (short of the kernel reclaiming pages under memory pressure).

    Writing 5 to /proc/self/clear_refs resets the mark to the current resident size (Linux >= 4.0,
    proc(5)), so the mark afterwards is this block's peak. Where that write is refused the mark
    is the lifetime peak: if it rose during the block it is the block's peak; if not, the block's
    peak is only bounded by an earlier one, and `peak` is that bound with `exact` False."""

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.reset = True
        except OSError:
            self.reset = False
        self._lifetime_before = _maxrss_bytes()
        return self

    def __exit__(self, *exc):
        if self.reset:
            self.peak, self.exact = _status_kib("VmHWM") * 1024, True
        else:
            self.peak = _maxrss_bytes()
            self.exact = self.peak > self._lifetime_before
