"""Where a phase of the actor spends its time: torch's profiler over one call of a recipe's actor
(`--phase update`: `update_actor`, the default; `score`: `compute_log_prob`; `generate`:
`generate_sequences`), after a warm-up call (optimizer state allocated) and `--timed` timed ones
(default 2), each with its seconds in the kernel and its page faults (this process's); with
`--fresh`, each timed update after a rollout of its own, as in a training step.

    python benchmarks/update_profile.py grpo/smollm2-arithmetic --top 15
    python benchmarks/update_profile.py grpo/quickstart --phase score --set model.path=... --trace t.json

The batches are the recipe's own rollouts (its prompts, its generation settings) with random
advantages: the work depends on their shapes, not on the values. Prints the timed calls' seconds,
the batch's tokens, and the operators with the most time of their own. On a GPU it profiles the
device too: the kernels' busy time against the profiled call's wall time (how far the phase is
bound by the host launching work rather than by the device), the operators by device time, and
how often the host waited for the device (`cudaStreamSynchronize`, `.item()`, copies to the host).
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.worker import resolve
from hflow.trainer.config.load import load_recipe
from hflow.trainer.work.bench import _actor


def _batches(actor, data, count: int, scored: bool, first: int = 1) -> list[Batch]:
    batches = []
    for step in range(first, first + count):
        rollout = resolve(actor.generate_sequences(data.batch(step)))
        advantages = torch.randn(len(rollout), generator=torch.Generator().manual_seed(step))
        batch = rollout | Batch({col.ADVANTAGES: advantages})
        if scored and col.OLD_LOG_PROBS not in batch:  # the recipe recomputes them before its update
            batch = batch | resolve(actor.compute_log_prob(batch))
        batch.meta["step"] = step
        batches.append(batch)
    return batches


def _call(actor, phase: str, batch: Batch, data, step: int):
    if phase == "update":
        return resolve(actor.update_actor(batch))
    if phase == "score":
        return resolve(actor.compute_log_prob(batch))
    return resolve(actor.generate_sequences(data.batch(step)))


def _table(ops, key, total: float, top: int, title: str) -> None:
    print(f"{title}: {total / 1e6:.3f} s")
    print(f"{'operator':48s} {'self s':>8s} {'share':>7s} {'calls':>7s}")
    for e in sorted(ops, key=key, reverse=True)[:top]:
        print(f"{e.key[:48]:48s} {key(e) / 1e6:8.3f} {key(e) / max(total, 1):7.1%} {e.count:7d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    parser.add_argument("--phase", default="update", choices=["update", "score", "generate"])
    parser.add_argument("--top", type=int, default=15, help="operators listed")
    parser.add_argument("--timed", type=int, default=2, help="timed calls before the profiled one")
    parser.add_argument("--fresh", action="store_true",
                        help="(--phase update) each timed update on a batch the actor generates just before it, "
                             "as a training step runs them: the rollout's own allocations between the updates")
    parser.add_argument("--trace", help="also write the profiled call's Chrome trace to this file")
    parser.add_argument("--shapes", default="", help="comma-separated operators (aten::fill_, ...) also listed by "
                                                      "input shape, their --top costliest shapes each")
    args = parser.parse_args()
    recipe, _ = load_recipe(args.recipe, ["trainer.eval_every=0", *args.set])
    groups, data = _actor(recipe)
    cuda = torch.cuda.is_available() and recipe.trainer.device != "cpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        actor = groups["actor"]
        # A generation's own prompts are the steps after these; with --fresh each timed update's batch
        # is generated just before it, so only the warm-up's and the profiled call's are made here.
        count, fresh = args.timed + 2, args.fresh and args.phase == "update"
        batches = _batches(actor, data, 2 if fresh else count, scored=args.phase == "update")
        _call(actor, args.phase, batches[0], data, count + 1)
        timed = []
        for i in range(args.timed):
            batch = _batches(actor, data, 1, scored=True, first=count + 1 + i)[0] if fresh else batches[1 + i]
            before = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            _call(actor, args.phase, batch, data, count + 2 + i)
            after = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            timed.append((after[1] - before[1], after[0].ru_stime - before[0].ru_stime,
                          after[0].ru_minflt - before[0].ru_minflt))
        with profile(activities=activities, record_shapes=bool(args.shapes)) as prof:
            start = time.perf_counter()
            _call(actor, args.phase, batches[-1], data, 2 * count)
            wall = time.perf_counter() - start
    finally:
        groups.shutdown()
    print(f"{args.phase} seconds: {', '.join(f'{t[0]:.3f}' for t in timed)}; profiled {wall:.3f}; rows "
          f"{len(batches[-1])}, tokens {int(batches[-1][col.ATTENTION_MASK].sum())} "
          f"(response {int(batches[-1][col.RESPONSE_MASK].sum())})")
    print(f"in the kernel: {', '.join(f'{t[1]:.2f} s ({t[2]} page faults)' for t in timed)}")
    ops = prof.key_averages()
    _table(ops, lambda e: e.self_cpu_time_total, sum(e.self_cpu_time_total for e in ops), args.top,
           "host operator time")
    for name in filter(None, args.shapes.split(",")):
        by_shape = [e for e in prof.key_averages(group_by_input_shape=True) if e.key == name]
        by_shape.sort(key=lambda e: -e.self_cpu_time_total)
        print(f"{name} by input shape:")
        for e in by_shape[:args.top]:
            print(f"  {e.self_cpu_time_total / 1e6:7.3f} s {e.count:6d} calls  {e.input_shapes}")
    if cuda:
        # The device's own events (kernels, copies): an operator's device time repeats its kernels'.
        kernels = [e for e in ops if e.device_type == DeviceType.CUDA]
        busy = sum(e.self_device_time_total for e in kernels)
        print(f"device kernels busy {busy / 1e6:.3f} s of the profiled {wall:.3f} s wall ({busy / 1e6 / wall:.1%}); "
              f"{sum(e.count for e in kernels)} kernels and copies")
        _table(kernels, lambda e: e.self_device_time_total, busy, args.top, "device time")
        waits = [e for e in ops if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "aten::item",
                                             "aten::_local_scalar_dense", "cudaMemcpyAsync")]
        for e in waits:
            print(f"host waits: {e.key} x{e.count}, {e.self_cpu_time_total / 1e6:.3f} s")
    if args.trace:
        prof.export_chrome_trace(args.trace)


if __name__ == "__main__":
    main()
