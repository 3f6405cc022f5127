"""The efficiency account of `hflow bench step`: per phase of the RL step, what it needed, what
it computed, the least time this machine allows for it, and the share of that limit it reached.

From each step's `work/<phase>/*` keys (`account.py`) and `timing/<phase>`, medians over the
steps, and two peaks measured here, on the run's device in the run's dtype:
  - the matrix-product rate (FLOP/s) at the phase's own shape, (tokens, hidden) x (hidden, ffn):
    a decode batch's rows for generation, a micro-batch's tokens for scoring and the update
    (thin products run well below the large-matrix rate, which is reported too); on a CPU the
    faster of torch's BLAS and oneDNN (`engine/kernels/cpu_products.py`), whichever the run used;
  - the memory bandwidth (bytes/s) of a large tensor copy;
each the best of `RATE_PASSES` measurements taken apart.
and the bytes the device can keep on chip between two passes over its data (`cache_bytes`).
A part of the phase's work (`needed.Part`) can take no less than the larger of its FLOPs at that
rate and the bytes it must read from memory (all but a cache's worth a pass) at that bandwidth (the
roofline, Williams et al. 2009), and a phase's parts run one after another (a decoding step waits
for the last one's token), so the phase's limit is its parts' limits added; the prefill's products
are as wide as its prompts, so its rate is the faster of the phase's and the large product's.
share = limit / measured time: 1 would be the machine's best at that shape, so 1 - share is what
is lost to waste (computed above needed), overheads and kernels below peak. Beside it, the least
memory the phase holds (weights, optimizer state, one micro-batch's activations, the KV cache:
the mapper's accounting), against the step's measured peak (`memory/peak_bytes`; RSS on a CPU,
which also holds Python, torch and the other roles). The step's line is the phases' sum.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from pathlib import Path

import torch

from hflow.engine.kernels.cpu_products import onednn_available, product
from hflow.engine.groups.dist import pick_device
from hflow.engine.models.loading import resolve_dtype
from hflow.mapper import memory
from hflow.mapper.models import ModelShape
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.step_memory import rollout_decode_rows
from hflow.trainer.work.account import PHASES, event_parts, needed_labels, role_shapes
from hflow.trainer.work.needed import Part

TRAINED = {"update_actor": "actor", "update_critic": "critic"}
LARGE = (1024, 1024, 1024)  # the large-matrix product whose rate is reported beside the phases'
# The peaks are measured in this many passes, each over every shape (so a second or more apart),
# and each one's best kept. On the 2-core development machine two threads ran a thin product at one
# of two rates that held for seconds (SmolLM2's 32 x 576 x 1,536: 245-260 or 295-337 GFLOP/s across
# fresh processes, 2026-11-28) and copied memory at 46 or 77 GB/s: one pass that met the slow state
# set a limit up to a third too generous, and the share of it as much too high. With 3 passes, three
# `bench step` runs of grpo/smollm2-arithmetic put generation's limit at 0.75-0.77 s, where single
# passes had put it at 0.74-1.23 s.
RATE_PASSES = 3
SECTION = {"actor": "actor", "reference": "actor", "critic": "critic", "cost_critic": "critic",
           "reward": "actor", "cost": "actor"}  # whose micro-batch sizes a model's passes use


def micro_rows(phase: str, label: str, recipe: Recipe) -> int:
    """Sequences per forward of the phase: the training micro-batch in an update, else the scoring one."""
    section = getattr(recipe, SECTION[label])
    return section.micro_batch_size if phase in TRAINED else section.scoring_micro_batch


def timed_rate(run, work: float, min_s: float = 0.02, sync=lambda: None) -> float:
    """`work` per second of `run()`: the best of 5 rounds of at least `min_s` each (after a warm-up)."""
    run()
    sync()
    best = float("inf")
    for _ in range(5):
        count, start = 0, time.perf_counter()
        while True:
            run()
            count += 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
        best = min(best, elapsed / count)
    return work / best


def _sync(device: torch.device):
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def matmul_rate(m: int, k: int, n: int, device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of an (m, k) x (k, n) matrix product (2 m k n per product): the machine's best. On a
    CPU the best of torch's BLAS and oneDNN (`engine/kernels/cpu_products.py`: whichever the run uses, the
    limit is the faster), each on torch's thread count and on one thread (a small product on
    several threads waits at every parallel region for a core another process holds, a shared
    machine; one thread never does)."""
    a = torch.randn(max(1, m), k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    flops = 2.0 * max(1, m) * k * n
    if device.type != "cpu":
        return timed_rate(lambda: a @ b, flops, sync=_sync(device))
    ways = [lambda: a @ b]
    if dtype == torch.float32 and onednn_available():
        weight = b.t().contiguous()
        ways.append(lambda: product(a, weight))
    threads = torch.get_num_threads()
    rates = [timed_rate(way, flops) for way in ways]
    if threads > 1:
        torch.set_num_threads(1)
        try:
            rates += [timed_rate(way, flops) for way in ways]
        finally:
            torch.set_num_threads(threads)
    return max(rates)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 28) -> float:
    """Bytes/s of copying a large tensor: each copy reads and writes `nbytes`."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return timed_rate(lambda: dst.copy_(src), 2.0 * nbytes, min_s=0.1, sync=_sync(device))


def _median(events: list[dict], key: str) -> float | None:
    values = [e[key] for e in events if key in e]
    return statistics.median(values) if values else None


def cache_bytes(device: torch.device, cpus=None, root: str = "/sys/devices/system/cpu") -> float:
    """Bytes a device can hold on chip between two passes over its data: on a CPU every cache of
    the cores this process may run on (`cpus`, default its affinity), each shared cache once
    (Linux's sysfs under `root`; 0 where it is not there), on a GPU its L2 cache and each
    multiprocessor's shared memory and registers."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        per_sm = getattr(props, "shared_memory_per_multiprocessor", 0) + 4 * getattr(props, "regs_per_multiprocessor", 0)
        return float(props.L2_cache_size + props.multi_processor_count * per_sm)
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else []
    caches = {}
    for cpu in cpus:
        for index in Path(root, f"cpu{cpu}", "cache").glob("index*"):
            try:
                level, kind, size, shared = (
                    (index / name).read_text().strip() for name in ("level", "type", "size", "shared_cpu_list"))
            except OSError:
                continue
            if kind != "Instruction":
                caches[level, kind, shared] = _size(size)
    return float(sum(caches.values()))


def _size(text: str) -> int:
    """sysfs's cache size ("48K", "32768K", "1M") in bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


def part_times(parts: dict[str, Part], rate: float, prefill_rate: float, bandwidth: float,
               cache: float) -> dict[str, tuple[float, float]]:
    """Each part's (compute, memory) seconds at least: its FLOPs at `rate` (`prefill_rate` for the
    prefill), and its bytes but a cache's worth a pass at `bandwidth`."""
    return {name: (part.flops / (prefill_rate if name == "prefill" else rate),
                   max(0.0, part.nbytes - part.passes * cache) / bandwidth) for name, part in parts.items()}


def phase_limit(parts: dict[str, Part], rate: float, prefill_rate: float, bandwidth: float,
                cache: float) -> tuple[float, float]:
    """(limit, memory-bound seconds of it): the parts' own limits added (the module docstring)."""
    return added(part_times(parts, rate, prefill_rate, bandwidth, cache))


def added(times: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """(limit, memory-bound seconds) of parts that run in order: each the larger of its two times."""
    return sum(max(c, m) for c, m in times.values()), sum(m for c, m in times.values() if m > c)


def row_tokens(events: list[dict], recipe: Recipe) -> float:
    """Mean real tokens per row (prompt + response) over the steps."""
    tokens = [e["throughput/tokens_per_s"] * e["timing/step"] for e in events if "throughput/tokens_per_s" in e]
    return statistics.median(tokens) / recipe.sequences_per_step if tokens else 1.0


def distinct_row_tokens(tokens_per_row: float, response: float | None, n: int) -> float:
    """The tokens a row needs of its own when the n rows of a prompt's group hold the prompt once
    (as the needed FLOPs count it): its response and an n-th of the prompt."""
    return tokens_per_row if response is None else response + (tokens_per_row - response) / n


def phase_rows(phase: str, label: str, recipe: Recipe, tokens_per_row: float) -> int:
    """The rows of the phase's typical matrix product: a decode batch, or a micro-batch's tokens."""
    if phase == "generate":
        return rollout_decode_rows(recipe)
    return int(micro_rows(phase, label, recipe) * tokens_per_row)


def minimum_memory(phase: str, label: str, shape: ModelShape, recipe: Recipe, tokens_per_row: float,
                   nbytes: int, scored_per_row: float | None = None) -> tuple[float, float]:
    """(resident, transient) bytes the phase needs at least: the model's weights (and, when it
    trains, its gradients and AdamW state), and one micro-batch's activations (the LM head's logits
    at the `scored_per_row` positions a row it scores, the response's: the run's mean) or the decode
    batch's KV cache."""
    lm_head = label in ("actor", "reference")
    seq = max(1, round(tokens_per_row))
    if label in ("actor", "critic", "cost_critic"):
        resident = memory.model_states(shape.params(lm_head), nbytes, 1, 1, 1, zero=0).total
    else:
        resident = memory.frozen_weights(shape.params(lm_head), nbytes, 1, 1)
    micro = micro_rows(phase, label, recipe)
    if phase == "generate":
        return resident, memory.kv_cache(shape, rollout_decode_rows(recipe), seq, 1, nbytes)
    if phase in TRAINED:
        return resident, memory.train_activations(shape, lm_head, micro, seq, 1, recipe.model.gradient_checkpointing,
                                                  nbytes, scored_per_row)
    return resident, memory.inference_activations(shape, lm_head, micro, seq, 1, nbytes, scored_per_row)


def best_peaks(products: list[tuple[int, int, int]], device: torch.device, dtype: torch.dtype,
               passes: int = RATE_PASSES) -> tuple[dict[tuple[int, int, int], float], float]:
    """Each product's FLOP/s and the copy bandwidth, the best of `passes` measurements taken apart
    (one pass over them all, then the next): see `RATE_PASSES`."""
    rates: dict[tuple[int, int, int], float] = {}
    bandwidth = 0.0
    for _ in range(passes):
        for shape in products:
            rates[shape] = max(rates.get(shape, 0.0), matmul_rate(*shape, device, dtype))
        bandwidth = max(bandwidth, copy_bandwidth(device))
    return rates, bandwidth


def account(events: list[dict], recipe: Recipe) -> dict:
    """The account of a run's step events (see the module docstring): {"phases", "step", "peaks"}."""
    device = pick_device(recipe.trainer.device)
    dtype = resolve_dtype(recipe.model.dtype, device)
    nbytes = torch.finfo(dtype).bits // 8
    response = _median(events, "response_length/mean")
    shapes, per_row = role_shapes(recipe), row_tokens(events, recipe)
    # The least memory counts a prompt once for its group; the typical product keeps every row's
    # whole length, the larger shape (a packed pass may hold more rows than a micro-batch's count:
    # its budget is micro_batch_size x the longest row), whose faster peak sets the stricter limit.
    distinct = distinct_row_tokens(per_row, response, recipe.rollout.n)
    counted = {}  # phase -> (its model's label, its typical product)
    for phase in PHASES:
        if _median(events, f"work/{phase}/needed_flops") is not None:
            label = next(label for label in needed_labels(phase, recipe) if label in shapes)
            shape = shapes[label]
            counted[phase] = label, (phase_rows(phase, label, recipe, per_row), shape.hidden, shape.ffn)
    rates, bandwidth = best_peaks(list(dict.fromkeys([LARGE, *(shape for _, shape in counted.values())])),
                                  device, dtype)
    cache = cache_bytes(device)
    peaks = {"matmul_1024_flops_per_s": rates[LARGE], "bandwidth_bytes_per_s": bandwidth,
             "cache_bytes": cache, "dtype": str(dtype).removeprefix("torch.")}
    phases, resident = {}, {}
    for phase, (label, typical) in counted.items():
        held, transient = minimum_memory(phase, label, shapes[label], recipe, distinct, nbytes, response)
        resident[label] = max(resident.get(label, 0.0), held)
        times = functools.partial(part_times, rate=rates[typical], prefill_rate=max(rates[typical], rates[LARGE]),
                                  bandwidth=bandwidth, cache=cache)
        phases[phase] = phase_line(events, phase, rates[typical], times,
                                   {"matmul_shape": list(typical), "min_memory_bytes": held + transient,
                                    "transient_bytes": transient})
    step = step_line(phases, sum(resident.values()), max(e.get("memory/peak_bytes", 0.0) for e in events))
    return {"phases": phases, "step": step, "peaks": peaks}


def phase_line(events: list[dict], phase: str, flops_per_s: float, times, extra: dict) -> dict:
    """One phase's figures: medians over the steps of its needed and computed work, its limit (each
    step's from its own parts: `times(parts)` -> `part_times`) and time; where the work is parts,
    each part's medians over the steps (0 in a step without it) under "parts"."""
    needed = _median(events, f"work/{phase}/needed_flops")
    nbytes = _median(events, f"work/{phase}/needed_bytes") or 0.0
    computed = _median(events, f"work/{phase}/computed_flops")
    measured = _median(events, f"timing/{phase}")
    logged = [event_parts(e, phase) for e in events if f"work/{phase}/needed_flops" in e]
    steps = [(parts, times(parts)) for parts in logged]
    limits = [added(t) for _, t in steps]
    seconds, memory_bound = (statistics.median(column) for column in zip(*limits))
    names = list(dict.fromkeys(name for parts, _ in steps for name in parts))
    return {
        "needed_flops": needed, "needed_bytes": nbytes, "computed_flops": computed,
        "computed_over_needed": computed / needed if computed is not None and needed else None,
        "peak_flops_per_s": flops_per_s,
        "bound": "memory" if 2 * memory_bound > seconds else "compute", "memory_bound_s": memory_bound,
        "limit_s": seconds, "measured_s": measured,
        "share_of_limit": seconds / measured if measured else None, **extra,
        "parts": {} if names == ["pass"] else {name: _part_line(name, steps) for name in names},
    }


def _part_line(name: str, steps: list) -> dict:
    """A part's medians over the steps: its needed work, passes and limit (0 where it did not run)."""
    none = Part(0.0, 0.0, 0)
    compute = statistics.median(t.get(name, (0.0, 0.0))[0] for _, t in steps)
    memory = statistics.median(t.get(name, (0.0, 0.0))[1] for _, t in steps)
    return {"needed_flops": statistics.median(p.get(name, none).flops for p, _ in steps),
            "needed_bytes": statistics.median(p.get(name, none).nbytes for p, _ in steps),
            "passes": statistics.median(p.get(name, none).passes for p, _ in steps),
            "limit_s": max(compute, memory), "bound": "memory" if memory > compute else "compute"}


def step_line(phases: dict, resident: float, peak_bytes: float) -> dict:
    """The whole step: the phases' sums (computed over needed of the phases that were counted)."""
    total = {key: sum(p[key] or 0.0 for p in phases.values())
             for key in ("needed_flops", "needed_bytes", "limit_s", "measured_s")}
    counted = [p for p in phases.values() if p["computed_flops"] is not None]
    computed = sum(p["computed_flops"] for p in counted)
    counted_needed = sum(p["needed_flops"] for p in counted)
    transient = max((p["transient_bytes"] for p in phases.values()), default=0.0)
    return {**total, "computed_flops": computed if counted else None,
            "computed_over_needed": computed / counted_needed if counted_needed else None,
            "share_of_limit": total["limit_s"] / total["measured_s"] if total["measured_s"] else None,
            "min_memory_bytes": resident + transient, "peak_memory_bytes": peak_bytes}


def table(acct: dict) -> list[str]:
    """The account as text lines: one per phase (and under it, one per part of its work), then the step."""
    head = (f"{'phase':14}{'GFLOP':>10}{'comp/need':>11}{'bound':>9}{'limit s':>10}{'measured s':>12}"
            f"{'share':>8}{'min MiB':>10}")
    lines = [head]
    for name, p in [*acct["phases"].items(), ("step", acct["step"])]:
        ratio = f"{p['computed_over_needed']:.2f}" if p["computed_over_needed"] is not None else "-"
        share = f"{p['share_of_limit']:.1%}" if p["share_of_limit"] is not None else "-"
        measured = f"{p['measured_s']:.4f}" if p["measured_s"] is not None else "-"
        lines.append(f"{name:14}{p['needed_flops'] / 1e9:>10.3f}{ratio:>11}{p.get('bound', ''):>9}"
                     f"{p['limit_s']:>10.4f}{measured:>12}{share:>8}{p['min_memory_bytes'] / 2**20:>10.1f}")
        for part, q in p.get("parts", {}).items():  # work that runs in order: each part's own limit
            if q["passes"] == 0:  # not in most steps
                continue
            lines.append(f"  {part:12}{q['needed_flops'] / 1e9:>10.3f}{'':>11}{q['bound']:>9}{q['limit_s']:>10.4f}"
                         f"{'':>12}{'':>8}{'':>10}   {q['passes']:g} pass{'es' if q['passes'] != 1 else ''}")
    peaks, step = acct["peaks"], acct["step"]
    lines.append(f"peaks ({peaks['dtype']}): matrix product {peaks['matmul_1024_flops_per_s'] / 1e9:.1f} GFLOP/s "
                 f"at 1024^3, memory copy {peaks['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
                 f"{peaks['cache_bytes'] / 2**20:.0f} MiB of caches; measured peak memory "
                 f"{step['peak_memory_bytes'] / 2**20:.0f} MiB against {step['min_memory_bytes'] / 2**20:.1f} MiB needed")
    return lines
