"""Synchronous against asynchronous RL on the same cores: tokens/s, reward after the same
samples, and each placement's bubble.

    python benchmarks/async_vs_sync.py [--recipe grpo/tiny_async] [--steps 20] [--rounds 3]
                                       [--configs sync-local,sync-split,async-local,async-split]
                                       [--stream K]
                                       [--size tiny|small|medium] [--model DIR] [--max-staleness 1]
                                       [--set KEY=VALUE ...] [--bound]

The placements (`--configs`), all on the same `cluster.cpu_slots` (default 2):
  sync-local   one process, every role colocated (torch's own thread count)
  sync-split   ray: the actor on one pool, reference and reward on the other
  async-local  one process, a generator thread beside the trainer (`trainer.mode: async`)
  async-split  ray: the rollout role on one pool, the training roles on the other (async)
A placement with `+stream` (e.g. `sync-split+stream`) also streams each step in chunks of
`--stream` prompts (`rollout.stream_prompts`; docs/async-streaming.md): reference and reward start on
a chunk while the next one generates; each chunk is one decoding batch (`rollout.batch_size` =
--stream x rollout.n), the others keep the recipe's batch size. An async placement with
`+updates` streams the same way and also trains each actor mini-batch as soon as it is scored
(`trainer.stream_updates`; the recipe's actor.mini_batch_size must be a multiple of a chunk).
Each round runs every placement once, in turn, so that all see the machine in the same state;
all in this one process (each ray run starts and stops its own Ray instance). The same recipe,
model, seeds and number of steps (so of samples) for all; the off-policy correction and every
other key stay the recipe's.

Printed per placement: tokens/s (prompt + response tokens over the wall time of the steps
after the first two, which warm up; the rollout's waits included), the median seconds per
step over the same steps (every placement's step has the same samples; its tokens differ
where the policies learned to answer at different lengths), reward/mean over the last
quarter of the steps (after the same number of samples for every placement), and the bubble:
the share of the pools' time spent idle, 1 - busy / (pools x step time). Busy is the stage
times of each pool (sync; on ray the workers' own measure) or the generator's and the
trainer's busy seconds (async, `async/*_busy_s`). Without --model a Llama of --size is built
in a temporary directory (the character tokenizer).

--bound also runs sync-local on one thread each round and prints two ceilings of async mode on
these cores, from that run's stage times: "one core each", the generator and the trainer each
on one core overlapping perfectly (a step takes max(generate, everything else)); and "any
schedule", all of the step's work packed on the cores at its one-thread speed (a step takes
the sum over cores), which no overlap of the same work can beat while one thread is a core's
most efficient use (memory bandwidth and caches shared by the two sides are ignored by both).
On shared cores async mode gains only what a stage loses by running on several threads.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

from hflow.cli.quiet import quiet_libraries
from hflow.engine.models.loading import build_tiny_model
from hflow.trainer.algorithms.registry import trainer_for
from hflow.trainer.config.load import load_recipe
from hflow.trainer.rundir.writer import RunDir

RAY_SPLIT = ["placement.backend=ray", "placement.mode=split"]
CONFIGS = {
    "sync-local": ("sync", ["placement.backend=local"]),
    "sync-split": ("sync", RAY_SPLIT),
    "async-local": ("async", ["placement.backend=local"]),
    "async-split": ("async", RAY_SPLIT),
}
WARM_UP = 2  # steps left out of the throughput: start-up, and nothing to overlap yet
NOT_WORK = ("step", "wait_rollout", "refresh_generator", "eval", "checkpoint", "export")
ONE_THREAD = "sync-local/1thread"  # --bound's run


def one_thread_run(args, model: str, out: str) -> dict:
    """sync-local on one thread: its tokens/s, and the ceiling of overlapping its generation
    with the rest of its step on two cores (see --bound in the module docstring)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # cpu_share leaves a one-thread start alone
    try:
        run = one_run("sync-local", args, model, out)
    finally:
        torch.set_num_threads(threads)
    events = run["events"]
    wall = sum(e["timing/step"] for e in events)
    overlapped = sum(max(e["timing/generate"], e["timing/step"] - e["timing/generate"]) for e in events)
    # Tokens over the time each schedule would take: max(...) per step, or the work over the cores.
    return {**run, "one core each": run["tokens_per_s"] * wall / overlapped,
            "any schedule": run["tokens_per_s"] * args.slots}


def one_run(config: str, args, model: str, out: str) -> dict:
    base, *flags = config.split("+")
    mode, placement = CONFIGS[base]
    if "updates" in flags:
        placement = [*placement, "trainer.stream_updates=true"]
    if flags:
        # Each chunk is one decoding batch (docs/async-streaming.md); the other placements keep the
        # recipe's rollout.batch_size, so each is measured at its own best.
        n = load_recipe(args.recipe, args.set)[0].rollout.n
        placement = [*placement, f"rollout.stream_prompts={args.stream}", f"rollout.batch_size={args.stream * n}"]
    overrides = [f"model.path={model}", "model.init=null", f"trainer.mode={mode}",
                 f"trainer.max_staleness={args.max_staleness}", f"trainer.total_steps={args.steps}",
                 "trainer.save_every=0", "trainer.eval_every=0", "logging.progress=lines",
                 "logging.wandb.enabled=false", *placement, *args.set]
    if "placement.backend=ray" in placement:
        overrides.append(f"cluster.cpu_slots={args.slots}")
    recipe, _ = load_recipe(args.recipe, overrides)
    recipe.name = f"bench-{config}"
    run = RunDir.create(recipe, out)
    try:
        trainer_for(recipe.algorithm)(recipe, run)
    finally:
        run.close()
    pools = 2 if base != "sync-local" else 1
    events = [e for e in run.events() if e["step"] > WARM_UP]
    wall = sum(e["timing/step"] for e in events)
    tokens = sum(e["throughput/tokens_per_s"] * e["timing/step"] for e in events)
    last = run.events()[-max(1, args.steps // 4):]
    return {"tokens_per_s": tokens / wall, "step_s": wall / len(events),
            "reward": statistics.mean(e["reward/mean"] for e in last),
            "bubble": 1 - sum(busy_s(e, mode) for e in events) / (pools * wall), "events": events}


def busy_s(event: dict, mode: str) -> float:
    """The seconds the step's pools worked (see the module docstring)."""
    if mode == "async":
        return event["async/generate_busy_s"] + event["async/train_busy_s"]
    return sum(v for k, v in event.items() if k.startswith("timing/") and k[7:] not in NOT_WORK)


def known(config: str) -> bool:
    base, *flags = config.split("+")
    allowed = {"stream", "updates"} if base.startswith("async") else {"stream"}
    return base in CONFIGS and set(flags) <= allowed and len(set(flags)) == len(flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="grpo/tiny_async")
    parser.add_argument("--steps", type=int, default=20, help=f"RL steps per run (more than {WARM_UP})")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated: {', '.join(CONFIGS)}, each optionally with +stream "
                        "(async ones also with +updates)")
    parser.add_argument("--stream", type=int, default=4, help="prompts per chunk of the +stream placements")
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--slots", type=int, default=2, help="cluster.cpu_slots of the ray placements")
    parser.add_argument("--size", default="tiny", help="the Llama built without --model: tiny, small, medium")
    parser.add_argument("--model", help="a model directory (default: a Llama of --size built here)")
    parser.add_argument("--set", action="append", default=[], help="a recipe override for every run")
    parser.add_argument("--bound", action="store_true",
                        help="also run sync-local on one thread and print async mode's ceiling on these cores")
    args = parser.parse_args()
    configs = args.configs.split(",")
    unknown = [c for c in configs if not known(c)]
    if unknown:
        parser.error(f"--configs: unknown {', '.join(unknown)}; accepted: {', '.join(CONFIGS)}, each with +stream, "
                     "async ones also with +updates")
    if args.steps <= WARM_UP:
        parser.error(f"--steps must be more than {WARM_UP} (the first steps are left out as warm-up)")
    quiet_libraries()
    rows: dict[str, list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_tiny_model(f"{tmp}/model", args.size))
        for _ in range(args.rounds):
            for config in configs:
                rows[config].append(one_run(config, args, model, tmp))
            if args.bound:
                rows.setdefault(ONE_THREAD, []).append(one_thread_run(args, model, tmp))
    report(rows, args)


def report(rows: dict[str, list[dict]], args) -> None:
    print(f"{args.recipe} {' '.join(args.set)}, {args.steps} steps per run, max_staleness {args.max_staleness}, "
          f"{args.rounds} rounds (placements in turn), {args.slots} slots")
    print(f"{'placement':<20}{'tok/s by round':>30}{'median':>9}{'s/step':>8}{'reward':>8}{'bubble':>8}")
    medians = {}
    for config, runs in rows.items():
        medians[config] = statistics.median(r["tokens_per_s"] for r in runs)
        by_round = " ".join(f"{r['tokens_per_s']:.0f}" for r in runs)
        print(f"{config:<20}{by_round:>30}{medians[config]:>9.0f}"
              f"{statistics.median(r['step_s'] for r in runs):>8.3f}"
              f"{statistics.mean(r['reward'] for r in runs):>8.3f}"
              f"{statistics.mean(r['bubble'] for r in runs):>8.2f}")
    sync = {c: m for c, m in medians.items() if c.startswith("sync") and c != ONE_THREAD}
    async_ = {c: m for c, m in medians.items() if c.startswith("async")}
    if sync and async_:
        best_sync, best_async = max(sync, key=sync.get), max(async_, key=async_.get)
        per_round = [a["tokens_per_s"] / s["tokens_per_s"] for a, s in zip(rows[best_async], rows[best_sync])]
        print(f"best async ({best_async}) / best sync ({best_sync}): {async_[best_async] / sync[best_sync]:.2f}x "
              f"(by round: {' '.join(f'{r:.2f}x' for r in per_round)})")
    if ONE_THREAD in rows and sync:
        best_sync = max(sync, key=sync.get)
        for kind in ("one core each", "any schedule"):
            ceilings = [r[kind] / s["tokens_per_s"] for r, s in zip(rows[ONE_THREAD], rows[best_sync])]
            ceiling = statistics.median(r[kind] for r in rows[ONE_THREAD])
            print(f"async ceiling on {args.slots} cores, {kind}: {ceiling:.0f} tok/s, {ceiling / sync[best_sync]:.2f}x "
                  f"best sync (by round: {' '.join(f'{c:.2f}x' for c in ceilings)})")


if __name__ == "__main__":
    main()
