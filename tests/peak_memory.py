"""A process's peak resident memory over a block, from the kernel's own counter (used by
tests/engine/rollout/test_hybrid.py), and the peak of what torch allocates
on the CPU inside a block (used by tests/engine/training/test_logprobs.py)."""

import json
import resource
from pathlib import Path


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


class PeakAllocated:
    """The peak of CPU memory allocated by torch inside the block and still live, in bytes, from
    the allocator's own reports (torch.profiler with `profile_memory`): every allocation and free
    of the CPU allocator while the block runs, in order, so no short-lived temporary is missed,
    and tensors that only autograd holds (saved for backward) count too. Tensors made before the
    block are not counted; what the block frees of them does not lower the count.

    Counts bytes, not time: the same code gives the same figure on any machine."""

    def __init__(self, trace_dir):
        self.trace = Path(trace_dir) / f"memory-trace-{id(self)}.json"

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc):
        self._profile.__exit__(*exc)
        if exc[0] is not None:
            return False
        self._profile.export_chrome_trace(str(self.trace))
        events = [e for e in json.loads(self.trace.read_text())["traceEvents"]
                  if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
        events.sort(key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))
        live, self.peak, sizes = 0, 0, {}
        for e in events:
            change, addr = e["args"]["Bytes"], e["args"]["Addr"]
            if change > 0:
                sizes[addr] = change
            elif sizes.pop(addr, None) is None:
                continue  # freed here, allocated before the block: not counted either way
            live += change
            self.peak = max(self.peak, live)
        self.trace.unlink()
        return False
