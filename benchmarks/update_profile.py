"""Where the actor's update spends its time: torch's profiler over one `update_actor` call of a
recipe's actor, by operator, after a warm-up update (optimizer state allocated) and two timed ones.

    python benchmarks/update_profile.py grpo/smollm2-arithmetic --top 15

The batches are the recipe's own rollouts (its prompts, its generation settings) with random
advantages: the update's work depends on their shapes, not on the values. Prints the timed updates'
seconds, the batch's tokens, the matrix products' share of the profiled update and the operators
with the most time of their own.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.worker import resolve
from hflow.trainer.config.load import load_recipe
from hflow.trainer.work.bench import _actor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    parser.add_argument("--top", type=int, default=15, help="operators listed")
    args = parser.parse_args()
    recipe, _ = load_recipe(args.recipe, ["trainer.eval_every=0", *args.set])
    groups, data = _actor(recipe)
    try:
        actor = groups["actor"]
        batches = []
        for step in range(1, 5):
            rollout = resolve(actor.generate_sequences(data.batch(step)))
            advantages = torch.randn(len(rollout), generator=torch.Generator().manual_seed(step))
            batch = rollout | Batch({col.ADVANTAGES: advantages})
            batch.meta["step"] = step
            batches.append(batch)
        resolve(actor.update_actor(batches[0]))
        seconds = []
        for batch in batches[1:3]:
            start = time.perf_counter()
            resolve(actor.update_actor(batch))
            seconds.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            resolve(actor.update_actor(batches[3]))
    finally:
        groups.shutdown()
    print(f"update seconds: {', '.join(f'{s:.2f}' for s in seconds)}; rows {len(batches[3])}, tokens "
          f"{int(batches[3][col.ATTENTION_MASK].sum())} (response {int(batches[3][col.RESPONSE_MASK].sum())})")
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops)
    print(f"profiled update: {total / 1e6:.2f} s of operator time")
    print(f"{'operator':48s} {'self s':>8s} {'share':>7s} {'calls':>7s}")
    for e in ops[:args.top]:
        print(f"{e.key[:48]:48s} {e.self_cpu_time_total / 1e6:8.3f} {e.self_cpu_time_total / total:7.1%} {e.count:7d}")


if __name__ == "__main__":
    main()
