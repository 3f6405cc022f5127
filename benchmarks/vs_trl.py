"""hflow's GRPO step throughput against TRL's GRPOTrainer, side by side in one process.

    pip install -e '.[bench]'            # TRL is a benchmark-only dependency
    python benchmarks/vs_trl.py [--steps 12] [--rounds 2] [--size tiny|small | --model DIR]
                                [--engine hf|vllm] [--prompts 16] [--max-new 64] [--threads N] [--json]

Both train the same model (a locally built one of --size, or the Hugging Face directory --model,
e.g. SmolLM2-135M-Instruct from `hflow init-model smollm2-135m-instruct DIR`) on the same prompts
(the synthetic `digits` task) with matching settings: --prompts prompts x n = 4 samples per step,
responses up to --max-new tokens, temperature 1, one optimizer step per RL step, no KL term
(TRL's default beta = 0), fp32 on the CPU, the same torch thread count. hflow generates with
--engine; with vllm it also rescores the rollout before the update (the engine requires it), a
pass TRL does not make at num_iterations=1. The metric is the paper's: prompt + response tokens
of the step's batch divided by the step's wall time.

The speed of a shared machine drifts over seconds, so the two alternate in rounds ordered
hflow, TRL, TRL, hflow, ... (each round a fresh run); a framework's figure is the median over
all its steps after each run's two warm-up steps, and every round's ratio is reported too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

N = 4
PROMPTS, MAX_NEW, LR = 16, 64, 1e-3  # defaults of --prompts, --max-new, --lr


def run_hflow(model_dir: str, steps: int, out: str, engine: str = "hf") -> dict:
    from hflow.trainer.algorithms import grpo
    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.rundir.writer import RunDir

    recipe, _ = load_recipe("grpo/quickstart", [
        f"model.path={model_dir}", "model.init=null", f"trainer.total_steps={steps}", "trainer.save_every=0",
        f"trainer.prompts_per_step={PROMPTS}", f"rollout.n={N}", f"rollout.max_response_length={MAX_NEW}",
        "grpo.kl_coef=0", f"actor.lr={LR}", f"actor.mini_batch_size={PROMPTS * N}",
        f"actor.micro_batch_size={PROMPTS * N}", "logging.samples_per_step=0", "logging.progress=lines",
        f"rollout.engine={engine}",
        # One update per step is exactly on-policy: like TRL at num_iterations=1, no second scoring
        # pass (the vllm engine always rescores: it reports no entropy).
        f"actor.recompute_old_log_probs={'true' if engine == 'vllm' else 'false'}",
    ])
    recipe.name = "bench-hflow"
    run = RunDir.create(recipe, out)
    grpo.train(recipe, run)
    run.close()
    events = run.events()[2:]
    return {"tokens_per_s": [e["throughput/tokens_per_s"] for e in events],
            "step_s": [e["timing/step"] for e in events]}


def run_trl(model_dir: str, steps: int, out: str, threads: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hflow.trainer.data.rewards import synthetic
    from hflow.trainer.data.tasks import make_rows

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = make_rows("digits", PROMPTS * (steps + 1), seed=0)
    dataset = Dataset.from_list(rows)
    tokens: list[int] = []

    def reward(prompts, completions, task, answer, **_):
        tokens.append(sum(len(tokenizer(p + c, add_special_tokens=False).input_ids) for p, c in
                          zip(prompts, completions)))
        return synthetic(prompts, completions, task=task, answer=answer)

    class StepClock(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self._start = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            torch.set_num_threads(threads)  # accelerate sets its own count; compare like with like

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)

    clock = StepClock()
    config = GRPOConfig(
        output_dir=out, per_device_train_batch_size=PROMPTS * N, num_generations=N,
        max_completion_length=MAX_NEW, learning_rate=LR, max_steps=steps, beta=0.0, temperature=1.0,
        num_iterations=1, gradient_accumulation_steps=1, steps_per_generation=1, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, bf16=False, shuffle_dataset=False,
        lr_scheduler_type="constant", seed=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    return {"tokens_per_s": [t / s for t, s in zip(tokens[2:], clock.times[2:])], "step_s": clock.times[2:]}


def main() -> None:
    global PROMPTS, MAX_NEW, LR  # the run functions read the settings chosen on the command line
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12, help="steps per run (the first 2 are warm-up)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each framework, alternating")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--model", default=None, help="a Hugging Face model directory instead of --size")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="hflow's generation engine")
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per step (x 4 samples)")
    parser.add_argument("--max-new", type=int, default=MAX_NEW, help="most new tokens per response")
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both (0: torch's default)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be at least 3 (two warm-up steps are dropped)")
    threads = args.threads or torch.get_num_threads()
    PROMPTS, MAX_NEW, LR = args.prompts, args.max_new, args.lr

    from hflow.cli.quiet import quiet_libraries
    from hflow.engine.models.loading import build_tiny_model

    quiet_libraries()
    runs = {"hflow": lambda model, steps, out: run_hflow(model, steps, out, args.engine),
            "trl": lambda model, steps, out: run_trl(model, steps, out, threads)}
    steps: dict[str, dict[str, list[float]]] = {name: {"tokens_per_s": [], "step_s": []} for name in runs}
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or str(build_tiny_model(f"{tmp}/model", args.size))
        for i in range(args.rounds):
            order = ["hflow", "trl"] if i % 2 == 0 else ["trl", "hflow"]
            medians = {}
            for name in order:
                torch.set_num_threads(threads)  # accelerate may change it: every run gets the same
                result = runs[name](model_dir, args.steps, f"{tmp}/{name}-{i}")
                for key in steps[name]:
                    steps[name][key] += result[key]
                medians[name] = statistics.median(result["tokens_per_s"])
            rounds.append({**medians, "ratio": medians["hflow"] / medians["trl"]})
    summary = {name: {"tokens_per_s": statistics.median(v["tokens_per_s"]), "step_s": statistics.median(v["step_s"])}
               for name, v in steps.items()}
    result = {"model": args.model or args.size, "engine": args.engine, "threads": threads, "prompts_per_step": PROMPTS, "n": N,
              "max_response_length": MAX_NEW, "rounds": rounds, **summary,
              "ratio": summary["hflow"]["tokens_per_s"] / summary["trl"]["tokens_per_s"]}
    if args.json:
        print(json.dumps(result))
        return
    print(f"model {result['model']}, hflow engine {args.engine}, {PROMPTS} prompts x {N} samples, up to {MAX_NEW} new tokens, {threads} threads, "
          f"{args.rounds} rounds of {args.steps} steps")
    for i, r in enumerate(rounds):
        print(f"round {i + 1}: hflow {r['hflow']:.0f} tokens/s, TRL {r['trl']:.0f} tokens/s, ratio {r['ratio']:.2f}x")
    print(f"{'median':8}{'tokens/s':>10}{'s/step':>9}")
    for name in ("hflow", "trl"):
        print(f"{name:8}{result[name]['tokens_per_s']:>10.0f}{result[name]['step_s']:>9.3f}")
    print(f"ratio hflow / TRL: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
