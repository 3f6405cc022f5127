"""A decoding step's sampling through the compiled kernel (`engine/kernels/sampling.py`) against
torch's path (`rollout/generation.py`'s `drawn` without it), side by side in one process: alone, at
SmolLM2-135M's vocabulary and a decoding batch's rows by default; or, with a recipe, its actor's
generation, the kernel turned on and off between calls (the same prompts and seed each time).

    python benchmarks/sampling_ab.py
    python benchmarks/sampling_ab.py --recipe grpo/quickstart --set model.path=... --rounds 10

Prints each way's best and median milliseconds over `--rounds`, the ways alternating, and the
ratio of the medians. Under the command's host-memory settings (`engine/host_memory.py`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import hflow.cli  # noqa: F401,E402  (the command's host-memory and thread settings, before torch loads)
import torch  # noqa: E402
from alternating import report  # noqa: E402

from hflow.engine.kernels import sampling  # noqa: E402
from hflow.engine.rollout.generation import SamplingParams, UniformDraws, drawn  # noqa: E402


def alone(rows_list: list[int], vocab: int, rounds: int) -> None:
    kernel = sampling.available()
    params = SamplingParams(max_new_tokens=1)
    for rows in rows_list:
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)) * 3
        draws = UniformDraws(rows, 1, torch.Generator().manual_seed(0), torch.device("cpu"))
        report(f"one step's sampling, {rows} rows x {vocab} tokens",
                {"torch": lambda: drawn(logits, 0, params, draws, None),
                 "kernel": lambda: drawn(logits, 0, params, draws, None, kernel)}, rounds)


def generation(recipe_name: str, overrides: list[str], rounds: int) -> None:
    from hflow.engine.groups.worker import resolve
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.work.bench import _actor

    recipe, _ = load_recipe(recipe_name, ["trainer.eval_every=0", *overrides])
    groups, data = _actor(recipe)
    actor, found = groups["actor"], sampling.available
    kernel = found()

    def call(way):
        def run():
            sampling.available = way
            resolve(actor.generate_sequences(data.batch(1)))
        return run
    try:
        report(f"{recipe_name}: the actor's generation of step 1's prompts",
                {"torch": call(lambda: None), "kernel": call(lambda: kernel)}, rounds)
    finally:
        sampling.available = found
        groups.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="32,16", help="comma-separated decoding batch rows")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--recipe", help="time this recipe's generation instead of the sampling alone")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    args = parser.parse_args()
    if sampling.available() is None:
        raise SystemExit("needs a C compiler (the sampling kernel)")
    if args.recipe:
        return generation(args.recipe, args.set, args.rounds)
    alone([int(r) for r in args.rows.split(",")], args.vocab, args.rounds)


if __name__ == "__main__":
    main()
