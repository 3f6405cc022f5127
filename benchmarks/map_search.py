"""How long the auto-mapper's search takes: the paper's PPO recipes on 8-128 A100-80GB.

    python benchmarks/map_search.py            # the table
    python benchmarks/map_search.py --check    # also fail if 70B on 128 GPUs takes 10 s or more

Each cell is a fresh search (no cache carried over), timed end to end: strategies for every
model and device count, every placement and allocation. `-` marks counts where nothing fits.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hflow.errors import UserError
from hflow.mapper.devices import resolve_device
from hflow.mapper.search import Mapper
from hflow.mapper.strategy import Setting
from hflow.mapper.workload import workload_from_recipe
from hflow.trainer.config.load import build_recipe, load_recipe

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "ppo"
MODELS = ["llama2-7b", "llama2-13b", "codellama-34b", "llama2-70b"]
GPUS = [8, 16, 32, 64, 128]
BUDGET_S = 10.0  # 70B PPO on 128 GPUs, on a 2-core machine


def timed_search(workload, gpus: int):
    setting = Setting(workload, resolve_device("a100-80g"), 8)
    start = time.perf_counter()
    try:
        result = Mapper(setting).search(gpus)
    except UserError:
        return time.perf_counter() - start, None
    return time.perf_counter() - start, result


def safe_rlhf_workload():
    """Safe-RLHF with five 7B roles: 52 placements, the largest search space shipped."""
    recipe = build_recipe({
        "algorithm": "safe_rlhf", "model": {"path": "llama2-7b", "dtype": "bfloat16", "gradient_checkpointing": True},
        "reward": {"model": "llama2-7b", "function": None}, "cost": {"model": "llama2-7b"},
        "data": {"train": "x.jsonl", "max_prompt_length": 1024}, "rollout": {"n": 1, "max_response_length": 1024},
        "trainer": {"prompts_per_step": 1024}, "actor": {"mini_batch_size": 128, "micro_batch_size": 4},
    }, {}, "safe-rlhf")
    return workload_from_recipe(recipe)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 if 70B/128 GPUs takes {BUDGET_S} s or more")
    args = parser.parse_args()
    # The paper's setting: ZeRO from stage 1 up (the recipes ship stage 3, what hflow's own engine needs).
    workloads = {name: workload_from_recipe(load_recipe(str(RECIPES / f"{name}.yaml"), ["actor.zero_stage=1"])[0])
                 for name in MODELS}
    workloads["safe-rlhf 7b x5"] = safe_rlhf_workload()
    print("search_s (best placement, estimated iteration s) on A100-80GB, 8 per node")
    print(f"{'model':<16}" + "".join(f"{g:>34}" for g in GPUS))
    worst = 0.0
    for name, workload in workloads.items():
        cells = []
        for gpus in GPUS:
            seconds, result = timed_search(workload, gpus)
            if result is None:
                cells.append(f"{seconds:.3f} s (no fit)")
                continue
            best = result.best
            sets = "|".join("+".join(r[:3] for r in group) for group in best.placement)
            cells.append(f"{seconds:.3f} s ({sets}, {best.iteration_s:.0f})")
            if name == "llama2-70b" and gpus == 128:
                worst = seconds
        print(f"{name:<16}" + "".join(f"{cell:>34}" for cell in cells))
    print(f"\n70B PPO on 128 GPUs: {worst:.3f} s (budget {BUDGET_S:.0f} s)")
    return 1 if args.check and worst >= BUDGET_S else 0


if __name__ == "__main__":
    sys.exit(main())
