"""How OpenMP's idle threads wait, measured on generation: a recipe's rollouts under each policy,
each in its own process (libgomp reads the policy once, at start), policies alternating in rounds,
with --busy K spinning processes beside every run or none.

    python benchmarks/wait_policy.py [--recipe grpo/smollm2-arithmetic] [--policies default,passive,spin1000,spin3000]
                                     [--rounds 2] [--busy 0] [--threads 2]
                                     [--whole-run [--steps 6] [--set KEY=VALUE ...]]

Policies: `default` (libgomp's own spin, about 300,000 iterations), `passive` (OMP_WAIT_POLICY=PASSIVE:
threads sleep at once), `spinN` (GOMP_SPINCOUNT=N). Each run generates the recipe's first four
prompt batches (n samples each, its response length) with the hf engine on --threads threads and
prints the median seconds of the last three. With --whole-run each run is `hflow train RECIPE` for
--steps steps (with the --set overrides) without OMP_NUM_THREADS, so that the run's thread share
(`trainer/placement/cpu_share.py`) chooses its threads before each step; it prints the medians of
the step and of its generation after the first two steps, and the thread counts the steps took.
`engine/cpu_threads.py` chose its spins from these figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hflow.trainer.rundir.layout import EVENTS
from hflow.trainer.rundir.writer import read_jsonl

CHILD = "--child"


def policy_env(policy: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy.startswith("spin"):
        env["GOMP_SPINCOUNT"] = policy.removeprefix("spin")
    elif policy != "default":
        sys.exit(f"--policies: unknown policy '{policy}' (default, passive or spinN)")
    return env


def child(recipe_name: str, threads: int) -> None:
    import torch

    from hflow.engine.models.loading import eos_token_ids, load_causal_lm, load_tokenizer
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.data.prompts import PromptData

    torch.set_num_threads(threads)
    recipe, _ = load_recipe(recipe_name, [])
    tokenizer = load_tokenizer(recipe.model.path)
    data = PromptData(recipe.data, tokenizer, recipe.seed, recipe.trainer.prompts_per_step)
    model = load_causal_lm(recipe.model.path, torch.float32).eval()
    generator = HFGenerator(model, eos_token_ids(model, tokenizer), tokenizer.pad_token_id, recipe.rollout.batch_size)
    params = SamplingParams(recipe.rollout.max_response_length, temperature=recipe.rollout.temperature)
    times = []
    for step in range(1, 5):
        start = time.perf_counter()
        generator.generate(data.batch(step)["prompt_ids"], recipe.rollout.n, params, torch.Generator().manual_seed(step))
        times.append(time.perf_counter() - start)
    print(statistics.median(times[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="grpo/smollm2-arithmetic")
    parser.add_argument("--policies", default="default,passive,spin1000,spin3000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside every run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--whole-run", action="store_true", help="time `hflow train` steps, its own thread share")
    parser.add_argument("--steps", type=int, default=6, help="--whole-run: steps per run (the first two dropped)")
    parser.add_argument("--set", action="append", default=[], help="--whole-run: a recipe override, KEY=VALUE")
    parser.add_argument(CHILD, action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.whole_run and a.steps < 3:
        parser.error("--steps must be at least 3 (the first two steps are dropped)")
    if a.child:
        return child(a.recipe, a.threads)
    policies = a.policies.split(",")
    for policy in policies:
        policy_env(policy)  # an unknown name stops here, before any run
    seconds: dict[str, list[float]] = {p: [] for p in policies}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    try:
        for i in range(a.rounds):
            for policy in policies if i % 2 == 0 else policies[::-1]:
                if a.whole_run:
                    seconds[policy].append(whole_run(a, policy_env(policy)))
                    continue
                done = subprocess.run([sys.executable, __file__, CHILD, "--recipe", a.recipe, "--threads",
                                       str(a.threads)], env=policy_env(policy), capture_output=True, text=True,
                                      check=True)
                seconds[policy].append(float(done.stdout.split()[-1]))
    finally:
        for p in busy:
            p.kill()
    if a.whole_run:
        print(f"{a.recipe}: `hflow train` seconds a step (its generation), {a.busy} busy processes beside")
        for policy, runs in seconds.items():
            print(f"{policy:10} step median {statistics.median(r[0] for r in runs):.3f} s, generation "
                  f"{statistics.median(r[1] for r in runs):.3f} s  rounds {[r[:2] for r in runs]} threads {runs[0][2]}")
        return
    print(f"{a.recipe}: generation seconds, {a.threads} threads, {a.busy} busy processes beside")
    for policy, values in seconds.items():
        print(f"{policy:10} median {statistics.median(values):.3f} s  rounds {[round(v, 3) for v in values]}")


def whole_run(a: argparse.Namespace, env: dict) -> tuple[float, float, list]:
    """One `hflow train` under `env` without OMP_NUM_THREADS: the medians of its steps and of their
    generation after the first two, and each kept step's thread count."""
    env = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "hflow", "train", a.recipe, "--output-dir", out, "--set",
               f"trainer.total_steps={a.steps}", "--set", "trainer.save_every=0", "--set", "logging.progress=lines"]
        for override in a.set:
            cmd += ["--set", override]
        subprocess.run(cmd, env={**env, "WANDB_MODE": "disabled"}, check=True, capture_output=True)
        events = [event for run in Path(out).iterdir() for event in read_jsonl(run / EVENTS)]
    steps = [e for e in events if "timing/step" in e][2:]
    return (round(statistics.median(e["timing/step"] for e in steps), 3),
            round(statistics.median(e["timing/generate"] for e in steps), 3), [e.get("cpu/threads") for e in steps])


if __name__ == "__main__":
    main()
