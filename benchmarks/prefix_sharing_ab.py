"""What running the prompts' common prefix once buys, side by side in one process, rounds alternating:
generation (the prefill's shared pass and the decoding cache's one copy of the prefix,
`engine/rollout/prefill.py`), scoring the old log-probs and the update (the packed passes' shared
prefix, run once for all the micro-batches of a scoring call or of an optimizer step:
`logprobs.HELD_FROM_MICRO_BATCHES`, `training/packed.py`), with the sharing on and off (every
prompt run whole, as before); scoring and the update also with the prefix run once per micro-batch.

    python benchmarks/prefix_sharing_ab.py grpo/smollm2-arithmetic --rounds 6
    python benchmarks/prefix_sharing_ab.py grpo/quickstart --set model.path=/tmp/m/small --set model.init=null \\
        --set data.train=prompts.jsonl --set data.max_prompt_length=320 ...

The update's batches are the recipe's own rollouts with random advantages (`update_profile.py`);
each round times one rollout of the next prompts, one scoring and one update of the same batch each
way. Prints
the medians and every round's seconds, and the prefix the prompts of the first batch share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    import hflow.cli  # noqa: F401  (the command's host-memory and thread settings)
    from hflow.engine.groups.worker import resolve
    from hflow.engine.prompt_prefix import common_prefix
    from hflow.engine.rollout import prefill
    from hflow.engine.training import logprobs, packed
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.work.bench import _actor
    from update_profile import _batches

    recipe, _ = load_recipe(args.recipe, ["trainer.eval_every=0", *args.set])
    groups, data = _actor(recipe)
    actor = groups["actor"]
    kept, held = (prefill.MIN_SHARED_TOKENS, packed.MIN_SHARED_TOKENS), logprobs.HELD_FROM_MICRO_BATCHES

    def sharing(on: bool, hold: bool = True) -> None:
        prefill.MIN_SHARED_TOKENS, packed.MIN_SHARED_TOKENS = kept if on else (sys.maxsize, sys.maxsize)
        logprobs.HELD_FROM_MICRO_BATCHES = held if hold else sys.maxsize

    try:
        print(f"the first prompts share {common_prefix(data.batch(1)['prompt_ids'])} tokens")
        batches = _batches(actor, data, 2, scored=True)
        for on in (True, False):  # warm-up: buffers and primitives of both ways
            sharing(on)
            resolve(actor.update_actor(batches[0]))
            resolve(actor.compute_log_prob(batches[0]))
        times = {way: {"rollout": [], "score": [], "update": []} for way in ("shared", "whole")}
        times["per micro"] = {"score": [], "update": []}  # the prefix shared within each micro-batch only
        for r in range(args.rounds):
            for way in (("shared", "whole") if r % 2 else ("whole", "shared")):
                sharing(way == "shared")
                start = time.perf_counter()
                resolve(actor.generate_sequences(data.batch(3 + r)))
                times[way]["rollout"].append(time.perf_counter() - start)
                hows = (("per micro", "shared") if r % 2 else ("shared", "per micro")) if way == "shared" else (way,)
                for phase, call in (("score", actor.compute_log_prob), ("update", actor.update_actor)):
                    for how in hows:
                        sharing(way == "shared", hold=how != "per micro")
                        start = time.perf_counter()
                        resolve(call(batches[1]))
                        times[how][phase].append(time.perf_counter() - start)
    finally:
        sharing(True)
        groups.shutdown()
    for phase in ("rollout", "score", "update"):
        medians = {way: statistics.median(t[phase]) for way, t in times.items() if phase in t}
        for way, t in times.items():
            if phase in t:
                rounds = ", ".join(f"{s:.3f}" for s in t[phase])
                print(f"{phase:8s} {way:9s} median {medians[way]:.3f} s  ({rounds})")
        print(f"{phase:8s} shared faster by {medians['whole'] / medians['shared']:.2f}x" +
              (f", than per micro-batch by {medians['per micro'] / medians['shared']:.2f}x" if phase != "rollout" else ""))


if __name__ == "__main__":
    main()
