"""hflow's GRPO step against TRL's GRPOTrainer, side by side, over a scan of model sizes.

    pip install -e '.[bench]'            # TRL is a benchmark-only dependency
    python benchmarks/vs_trl.py [--sizes tiny | small,medium,base] [--tokenizer char|bpe] [--model DIR]
                                [--steps 12] [--rounds 2] [--engine hf|vllm] [--prompts 16] [--max-new 64[,256,...]]
                                [--n 4[,16,...]] [--warmup 2] [--threads N] [--busy K] [--device cpu|cuda]
                                [--checkpointing defaults|on|off] [--trl-host-memory on|off] [--kl 0.04]
                                [--system-tokens 256] [--json]

Both train the same model (a locally built Llama of each --sizes entry: tiny 0.1M, small 3.4M,
medium 27M, base 85M parameters, with the character tokenizer or a 512-token byte-level BPE trained
here; or the Hugging Face directory --model) on the same prompts (the synthetic `digits` task) with
matching settings: --prompts prompts x --n samples per step, responses up to --max-new tokens
(comma-separated lists of --max-new and --n scan every pair: how the cost grows with long responses
and large groups), temperature 1, one optimizer step per RL step, no KL term (TRL's default beta =
0; --kl C gives both a frozen reference model and the KL penalty C: hflow's `grpo.kl_coef`, TRL's
`beta`), activation recomputation as each framework defaults (TRL's on, hflow's off;
--checkpointing on|off sets both alike: the fair comparison of memory), fp32 on the CPU (bf16 on a GPU: --device),
--threads torch threads (default: torch's own count). hflow runs as users run it, `hflow train` in
its own process (with the command's CPU thread and host-memory settings, `engine/cpu_threads.py`,
`engine/host_memory.py`); TRL runs in its own process with its defaults and, unless
--trl-host-memory off, the same host-memory settings (glibc's malloc thresholds, huge pages).
With --system-tokens N every prompt begins with the same instruction of N tokens (a system prompt:
hflow runs it once per step, `engine/prompt_prefix.py`; TRL runs it in every row).
With --engine vllm hflow also rescores the rollout before the update (the
engine requires it), a pass TRL does not make.

Per run the figure is the median over its steps after --warmup warm-up steps; the two frameworks
alternate in rounds (hflow, TRL, TRL, hflow, ...) because a shared machine's speed drifts.
Printed per size: seconds per step, tokens per second (prompt + response tokens of the step's
batch over its wall time), every round's ratio, each process's peak resident memory (hflow's
`memory/peak_bytes`, TRL's `ru_maxrss`: Python, torch and everything else included), and the step's achieved FLOP/s, 8 x parameters x
tokens per second (2 per token to generate it, 6 to train on it; the input embedding, a lookup,
not counted) against the machine's fp32 matrix-product peak measured here at the same thread
count. --busy K runs K spinning processes beside every run (a shared laptop or CI runner).

Beside it, hflow's efficiency account (`hflow bench step`'s, `trainer/work/bench_account.py`):
per phase the FLOPs and bytes it needed, what it computed, the least time this machine allows
(peaks measured here at the phase's shapes) and the share of that limit reached. TRL has no meter
of ours: its line is the same needed work for its own rows (prompt and completion lengths of
every step, prompts shared by their 4 samples, what prompts begin with alike once), the same limit,
and its measured step time.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The command's host-memory settings, for the TRL runs' environment (importing `hflow.cli` would
# apply them to this process and so to every TRL run it starts).
from hflow.engine.host_memory import keep_host_memory


def hflow_command(model_dir: str, out: str, a: argparse.Namespace) -> list[str]:
    engine = a.engine
    sets = [
        f"model.path={model_dir}", "model.init=null", f"trainer.total_steps={a.steps}", "trainer.save_every=0",
        f"trainer.prompts_per_step={a.prompts}", f"rollout.n={a.n}", f"rollout.max_response_length={a.max_new}",
        f"grpo.kl_coef={a.kl}", f"actor.lr={a.lr}", f"actor.mini_batch_size={a.prompts * a.n}",
        f"actor.micro_batch_size={a.prompts * a.n}", "logging.samples_per_step=0", "logging.progress=lines",
        f"rollout.engine={engine}", f"model.dtype={'bfloat16' if a.device == 'cuda' else 'float32'}",
        f"model.gradient_checkpointing={'true' if a.checkpointing == 'on' else 'false'}",
        # One update per step is exactly on-policy: like TRL at num_iterations=1, no second scoring
        # pass (the vllm engine always rescores: it reports no entropy).
        f"actor.recompute_old_log_probs={'true' if engine == 'vllm' else 'false'}",
    ]
    if a.system_tokens:  # the same rows as TRL's, each prompt after the shared instruction (`task_rows`)
        sets += [f"data.train={prompt_file(model_dir, out, a)}", f"data.max_prompt_length={a.system_tokens + 64}"]
    cmd = [sys.executable, "-m", "hflow", "train", "grpo/quickstart", "--output-dir", out]
    for s in sets:
        cmd += ["--set", s]
    return cmd


# The instruction `--system-tokens` puts before every prompt (repeated to the length asked): the
# system prompt or tool description that real RL prompts begin with, the same in every row.
INSTRUCTION = ("You are a careful assistant. Read the request to its end, keep to the format it asks for, "
               "and answer with digits only, with nothing before or after them. ")


def task_rows(model_dir: str, a: argparse.Namespace) -> list[dict]:
    """The digits task's rows both frameworks train on; with --system-tokens N, each prompt after
    the same instruction of N tokens (of this model's tokenizer)."""
    from hflow.trainer.data.tasks import make_rows

    rows = make_rows("digits", a.prompts * (a.steps + 1), seed=0)
    if a.system_tokens:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        text = INSTRUCTION * (a.system_tokens // 8 + 1)
        ids = tokenizer(text, add_special_tokens=False).input_ids[:a.system_tokens]
        head = tokenizer.decode(ids)
        rows = [{**row, "prompt": head + row["prompt"]} for row in rows]
    return rows


def prompt_file(model_dir: str, out: str, a: argparse.Namespace) -> str:
    """`task_rows` as a JSON-lines file (hflow's `data.train`), in the folder of the run `out`."""
    path = Path(out).parent / f"{Path(out).name}-prompts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text("".join(json.dumps(row) + "\n" for row in task_rows(model_dir, a)))
    return str(path)


def read_hflow(out: str, warmup: int) -> dict:
    events = [json.loads(line) for path in glob.glob(f"{out}/*/events.jsonl")
              for line in Path(path).read_text().splitlines()]
    steps = [e for e in events if "timing/step" in e][warmup:]
    return {"tokens_per_s": [e["throughput/tokens_per_s"] for e in steps], "step_s": [e["timing/step"] for e in steps],
            "events": steps, "peak_bytes": [max(e.get("memory/peak_bytes", 0) for e in events if "timing/step" in e)]}


def run_trl(model_dir: str, a: argparse.Namespace) -> dict:
    """One TRL run in this process (the `--run trl` child); per-step lists after the warm-up."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hflow.trainer.data.rewards import synthetic
    from hflow.trainer.work.needed import row_tries

    threads = torch.get_num_threads()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    dataset = Dataset.from_list(task_rows(model_dir, a))
    tokens: list[int] = []
    # Per step, each row's (prompt, completion) tokens and its prompt's (begun, rank) among the step's
    # (`needed.row_tries`: what the needed work counts once).
    rows: list[list[tuple[int, int, int, int]]] = []

    def reward(prompts, completions, task, answer, completion_ids, **_):
        # The sampled ids, not the decoded text re-tokenized (a BPE's random bytes re-encode longer).
        prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
        tries = zip(*(t.tolist() for t in row_tries(prompt_ids, torch.arange(len(prompts)) // a.n)))
        rows.append([(len(p), len(ids), *trie) for p, ids, trie in zip(prompt_ids, completion_ids, tries)])
        tokens.append(sum(row[0] + row[1] for row in rows[-1]))
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
        output_dir=a.out, per_device_train_batch_size=a.prompts * a.n, num_generations=a.n,
        max_completion_length=a.max_new, learning_rate=a.lr, max_steps=a.steps, beta=a.kl, temperature=1.0,
        num_iterations=1, gradient_accumulation_steps=1, steps_per_generation=1, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=a.device == "cpu", bf16=a.device == "cuda",
        shuffle_dataset=False, gradient_checkpointing=a.checkpointing != "off",
        lr_scheduler_type="constant", seed=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    w = a.warmup
    import resource  # the process's peak resident memory, as hflow's `memory/peak_bytes` on a CPU
    peak = (torch.cuda.max_memory_allocated() if a.device == "cuda"  # and its GPU peak, as hflow's on a GPU
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"tokens_per_s": [t / s for t, s in zip(tokens[w:], clock.times[w:])],
            "step_s": clock.times[w:], "rows": rows[w:], "peak_bytes": [peak]}


def build_model(out: str, size: str, tokenizer: str, context: int) -> Path:
    """A locally built Llama of `size` with the character tokenizer or a 512-token byte-level BPE,
    its context (`max_position_embeddings`, rotary: no learned table) at least `context`."""
    from hflow.engine.models.loading import build_tiny_model
    path = build_tiny_model(out, size, tokenizer=build_bpe_tokenizer() if tokenizer == "bpe" else None)
    config = json.loads((path / "config.json").read_text())
    if config["max_position_embeddings"] < context:
        config["max_position_embeddings"] = context
        (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def build_bpe_tokenizer(vocab: int = 512):
    """A byte-level BPE of `vocab` tokens trained on the digits task's text and random characters."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from hflow.engine.models.loading import BOS, EOS, PAD, TINY_CHARS, TINY_CHAT_TEMPLATE
    rng = random.Random(0)
    corpus = ["make digits: " + "".join(rng.choice(TINY_CHARS) for _ in range(rng.randint(5, 80)))
              for _ in range(5000)]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[PAD, BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS)
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def flop_params(model_dir: Path) -> int:
    """Parameters that cost 2 FLOPs per token forward: all but the input embedding's lookup."""
    from safetensors import safe_open
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys() if "embed_tokens" not in name)


CUDA_PEAK = ("import torch; from hflow.trainer.work.bench_account import matmul_rate; "
             "print(matmul_rate(8192, 8192, 8192, torch.device('cuda'), torch.bfloat16))")


def matmul_peak(env: dict, device: str = "cpu") -> float:
    """The matrix-product peak measured here: fp32 on the CPU, bf16 on a GPU."""
    code = CUDA_PEAK if device == "cuda" else \
        "from hflow.trainer.work.bench import matmul_peak_flops; print(matmul_peak_flops())"
    return float(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                text=True).stdout.split()[-1])


class Busy:
    """`k` processes spinning on the CPU while a run is timed."""

    def __init__(self, k: int):
        self.k, self.procs = k, []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.k)]

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


def one_run(name: str, model_dir: Path, out: str, a: argparse.Namespace, env: dict) -> dict:
    if name == "trl" and a.trl_host_memory == "on":  # what `hflow` sets for itself (engine/host_memory.py)
        env = dict(env)
        keep_host_memory(env)
    if name == "hflow":
        cmd = hflow_command(str(model_dir), out, a)
    else:
        cmd = [sys.executable, __file__, "--run", "trl", "--model", str(model_dir), "--out", out,
               *[f"--{k}={getattr(a, k.replace('-', '_'))}"
                 for k in ("steps", "prompts", "max-new", "n", "warmup", "lr", "device", "checkpointing", "kl",
                           "system-tokens")]]
    with Busy(a.busy):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        sys.exit(f"{name} run failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return read_hflow(out, a.warmup) if name == "hflow" else json.loads(done.stdout.strip().splitlines()[-1])


def scan_size(label: str, model_dir: Path, tmp: str, a: argparse.Namespace, env: dict, peak: float) -> dict:
    steps = {name: {"tokens_per_s": [], "step_s": [], "events": [], "rows": [], "peak_bytes": []}
             for name in ("hflow", "trl")}
    rounds = []
    for i in range(a.rounds):
        medians = {}
        for name in (["hflow", "trl"] if i % 2 == 0 else ["trl", "hflow"]):
            result = one_run(name, model_dir, f"{tmp}/{label}-{name}-{i}", a, env)
            for key in steps[name]:
                steps[name][key] += result.get(key, [])
            medians[name] = statistics.median(result["tokens_per_s"])
        rounds.append({**medians, "ratio": medians["hflow"] / medians["trl"]})
    params = flop_params(model_dir)
    out = {"model": label, "parameters": params, "n": a.n, "max_new": a.max_new, "rounds": rounds}
    for name, v in steps.items():
        tps = statistics.median(v["tokens_per_s"])
        out[name] = {"tokens_per_s": tps, "step_s": statistics.median(v["step_s"]),
                     "flops_per_s": 8 * params * tps, "of_peak": 8 * params * tps / peak,
                     "peak_bytes": max(v["peak_bytes"], default=0)}
    out["ratio"] = out["hflow"]["tokens_per_s"] / out["trl"]["tokens_per_s"]
    out["account"] = accounts(str(model_dir), a, steps, f"{tmp}/{label}-account")
    return out


TRL_PHASES = {False: ("generate", "update_actor"), True: ("generate", "reference", "update_actor")}


def accounts(model_dir: str, a: argparse.Namespace, steps: dict, out: str) -> dict:
    """hflow's efficiency account of its steps, and TRL's step against the same limit: the needed
    work of its own rows (generation, the reference's scoring with --kl, and the update: TRL at
    num_iterations=1 makes no other pass) over the same peaks."""
    import torch

    from hflow.trainer.config.load import load_recipe
    from hflow.trainer.work.bench_account import account, phase_limit
    from hflow.trainer.work.account import phase_needs, role_shapes
    from hflow.trainer.work.needed import StepRows, whole

    if a.threads:
        torch.set_num_threads(a.threads)
    cmd = hflow_command(model_dir, out, a)  # for its recipe (a prompts file beside `out`, in the temporary folder)
    recipe = load_recipe("grpo/quickstart", [v for k, v in zip(cmd, cmd[1:]) if k == "--set"])[0]
    hflow = account(steps["hflow"]["events"], recipe)
    shape, peaks = role_shapes(recipe)["actor"], hflow["peaks"]
    limits, flops = [], []
    for rows in steps["trl"]["rows"]:
        lengths = torch.tensor(rows)
        step_rows = StepRows(lengths[:, 0], lengths[:, 1], torch.arange(len(rows)) // a.n, lengths[:, 2], lengths[:, 3])
        needs = {phase: phase_needs(phase, "actor", shape, step_rows, recipe) for phase in TRL_PHASES[a.kl > 0]}
        flops.append(sum(whole(parts)[0] for parts in needs.values()))
        rates = {phase: hflow["phases"][phase]["peak_flops_per_s"] for phase in needs}
        limits.append(sum(phase_limit(parts, rates[phase], max(rates[phase], peaks["matmul_1024_flops_per_s"]),
                                      peaks["bandwidth_bytes_per_s"], peaks["cache_bytes"])[0]
                          for phase, parts in needs.items()))
    hflow_step = statistics.median(steps["hflow"]["step_s"])
    trl_step, trl_limit = statistics.median(steps["trl"]["step_s"]), statistics.median(limits)
    return {"hflow": {**hflow, "wall": {"limit_s": hflow["step"]["limit_s"], "step_s": hflow_step,
                                        "share_of_limit": hflow["step"]["limit_s"] / hflow_step}},
            "trl": {"needed_flops": statistics.median(flops), "limit_s": trl_limit, "step_s": trl_step,
                    "share_of_limit": trl_limit / trl_step}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="tiny", help="comma-separated: tiny, small, medium, base")
    parser.add_argument("--tokenizer", default="char", choices=["char", "bpe"])
    parser.add_argument("--model", default=None, help="a Hugging Face model directory instead of --sizes")
    parser.add_argument("--steps", type=int, default=12, help="steps per run (the first --warmup are dropped)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps dropped from each run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each framework, alternating")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="hflow's generation engine")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (x --n samples)")
    parser.add_argument("--max-new", default="64", help="most new tokens per response; a comma list scans them")
    parser.add_argument("--n", default="4", help="samples per prompt (GRPO's group); a comma list scans them")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--kl", type=float, default=0.0,
                        help="KL penalty against a frozen reference (hflow's grpo.kl_coef, TRL's beta); 0: none")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both (0: torch's default)")
    parser.add_argument("--system-tokens", type=int, default=0,
                        help="put the same instruction of this many tokens before every prompt (a system prompt)")
    parser.add_argument("--checkpointing", default="defaults", choices=["defaults", "on", "off"],
                        help="activation recomputation: each framework's default (TRL's GRPOConfig recomputes, "
                             "hflow's model.gradient_checkpointing does not), or on / off for both alike")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"],
                        help="where both train (default: cuda where torch sees a GPU): fp32 on the CPU; on a GPU "
                             "hflow's bf16 weights with fp32 masters and TRL's bf16 mixed precision")
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside every run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--trl-host-memory", default="on", choices=["on", "off"],
                        help="run TRL with the host-memory settings the hflow command gives itself (glibc's "
                        "malloc thresholds, huge pages: engine/host_memory.py); default on")
    parser.add_argument("--run", choices=["trl"], help=argparse.SUPPRESS)  # one TRL run (a child process)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.device is None:
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.system_tokens < 0:
        parser.error(f"--system-tokens {a.system_tokens}: give 0 (none) or more tokens")
    if a.steps <= a.warmup:
        parser.error(f"--steps must be more than --warmup {a.warmup} (the warm-up steps are dropped)")
    try:
        lengths, groups = [int(x) for x in str(a.max_new).split(",")], [int(x) for x in str(a.n).split(",")]
    except ValueError:
        parser.error(f"--max-new {a.max_new!r} and --n {a.n!r} take whole numbers separated by commas")
    if a.run:
        a.max_new, a.n = lengths[0], groups[0]
        print(json.dumps(run_trl(a.model, a)))
        return
    env = {**os.environ, **({"OMP_NUM_THREADS": str(a.threads)} if a.threads else {}), "WANDB_MODE": "disabled"}
    peak = matmul_peak(env, a.device)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        # Absolute: the TRL subprocess runs in the temporary folder.
        models = [(a.model, Path(a.model).resolve())] if a.model else [
            (f"{s}-{a.tokenizer}", build_model(f"{tmp}/{s}", s, a.tokenizer, max(lengths) + 512)) for s in a.sizes.split(",")]
        for label, model_dir in models:
            for max_new in lengths:
                for n in groups:
                    one = argparse.Namespace(**{**vars(a), "max_new": max_new, "n": n})
                    results.append(scan_size(f"{label}-r{max_new}-n{n}", model_dir, tmp, one, env, peak))
                    if not a.json:
                        report(results[-1], one)
    if a.json:
        print(json.dumps({"peak_flops_per_s": peak, "busy": a.busy, "engine": a.engine, "device": a.device,
                          "checkpointing": a.checkpointing, "sizes": results}))
    else:
        dtype = "bf16" if a.device == "cuda" else "fp32"
        print(f"{dtype} matrix-product peak here: {peak / 1e9:.0f} GFLOP/s; {a.busy} busy processes beside each run")


def report(r: dict, a: argparse.Namespace) -> None:
    print(f"\n{r['model']}: {r['parameters'] / 1e6:.1f}M parameters, hflow engine {a.engine}, {a.prompts} prompts "
          f"x {a.n}, up to {a.max_new} new tokens, {a.rounds} rounds of {a.steps} steps, {a.busy} busy processes")
    print("rounds (hflow / TRL):", ", ".join(f"{x['ratio']:.2f}x" for x in r["rounds"]))
    print(f"{'':8}{'s/step':>9}{'tokens/s':>10}{'GFLOP/s':>9}{'of peak':>9}{'peak MiB':>10}")
    for name in ("hflow", "trl"):
        m = r[name]
        print(f"{name:8}{m['step_s']:>9.3f}{m['tokens_per_s']:>10.0f}{m['flops_per_s'] / 1e9:>9.1f}{m['of_peak']:>9.0%}"
              f"{m['peak_bytes'] / 2**20:>10.0f}")
    print(f"ratio hflow / TRL: {r['ratio']:.2f}x")
    if a.system_tokens:
        print(f"(GFLOP/s counts every row's every token as computed; hflow runs the {a.system_tokens}-token "
              "instruction once a step, so its figure can pass the peak: the account below counts it once)")
    from hflow.trainer.work.bench_account import table

    acct = r["account"]
    print("hflow's efficiency account (medians over its steps):")
    for line in table(acct["hflow"]):
        print("  " + line)
    for name in ("hflow", "trl"):
        x = acct[name]["wall"] if name == "hflow" else acct[name]
        print(f"{name:6} step {x['step_s']:.4f} s against a limit of {x['limit_s']:.4f} s for the work its rows "
              f"need: {x['share_of_limit']:.1%} of the limit")


if __name__ == "__main__":
    main()
