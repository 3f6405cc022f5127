"""Does a refactor change what training computes? Train every tiny recipe with this tree and
with the tree of an earlier commit (same seeds, same machine) and compare the runs: every
metric of events.jsonl except the volatile ones (timing/, throughput/, memory/, time), the
samples, and the final weights, exactly.

    python benchmarks/same_metrics.py 7655046 --steps 12

The other tree runs from a temporary `git worktree`, imported as `hflow` through PYTHONPATH;
the tiny reward model of ppo/tiny is built once (by this tree) and shared. Exit 1 on a difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Every tiny recipe both trees ship.
RECIPES = ["grpo/quickstart", "grpo/quickstart_ray_split", "grpo/tiny_async", "grpo/tiny_calculator",
           "grpo/tiny_lora", "ppo/tiny", "remax/tiny", "safe_rlhf/tiny", "rloo/tiny", "reinforce_pp/tiny",
           "reinforce_pp/tiny_baseline", "dapo/tiny", "gspo/tiny", "cispo/tiny"]
# Measurements of the machine, not of the training: wall times (also every `*_s` key: async mode's
# busy and idle seconds, an episode's turn times) and the cores other processes used.
VOLATILE = ("timing/", "throughput/", "memory/", "time", "cpu/others_cores")


def hflow(tree: Path, work: Path, *args: str) -> None:
    """`python -m hflow ARGS` with `tree` as the hflow package, in `work` (recipes' relative paths)."""
    shim = work / f"pythonpath-{tree.name}"
    shim.mkdir(exist_ok=True)
    if not (shim / "hflow").exists():
        (shim / "hflow").symlink_to(tree)
    env = {**os.environ, "PYTHONPATH": str(shim), "WANDB_MODE": "disabled"}
    subprocess.run([sys.executable, "-m", "hflow", *args], cwd=work, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def run_dir(root: Path) -> Path:
    (path,) = [p for p in root.iterdir() if p.is_dir()]
    return path


def compare(a: Path, b: Path) -> list[str]:
    from safetensors.torch import load_file

    problems = []
    ev_a, ev_b = ([json.loads(line) for line in open(p / "events.jsonl")] for p in (a, b))
    if len(ev_a) != len(ev_b):
        problems.append(f"{len(ev_a)} vs {len(ev_b)} events")
    for x, y in zip(ev_a, ev_b):
        keys = {k for k in {*x, *y} if not k.startswith(VOLATILE) and not k.endswith("_s")}
        problems += [f"step {x['step']} {k}: {x.get(k)} vs {y.get(k)}" for k in sorted(keys) if x.get(k) != y.get(k)]
    if (a / "samples.jsonl").read_bytes() != (b / "samples.jsonl").read_bytes():
        problems.append("samples.jsonl differ")
    wa, wb = (load_file(p / "final" / "model.safetensors") for p in (a, b))
    if wa.keys() != wb.keys() or any(not bool((wa[k] == wb[k]).all()) for k in wa):
        problems.append("final weights differ")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the earlier commit to compare with")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hflow-same-metrics-"))
    base = work / "base"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.base], check=True,
                   stdout=subprocess.DEVNULL)
    failed = False
    try:
        hflow(REPO, work, "init-model", "tiny-reward", "models/tiny-reward-digits", "--task", "digits")
        for recipe in RECIPES:
            name = recipe.replace("/", "-")
            for label, tree in (("base", base), ("this", REPO)):
                hflow(tree, work, "train", recipe, "--output-dir", str(work / label / name),
                      "--set", f"trainer.total_steps={args.steps}")
            problems = compare(run_dir(work / "base" / name), run_dir(work / "this" / name))
            events = sum(1 for _ in open(run_dir(work / "this" / name) / "events.jsonl"))
            print(f"{recipe}: {events} events, " + ("identical" if not problems else "; ".join(problems[:5])))
            failed |= bool(problems)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
