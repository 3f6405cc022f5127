"""The first run on a GPU machine: what breaks, and the figures, in four parts of under ten minutes.

    make gpu-wheels                                   # here, with the package registry: ./.whl
    bash benchmarks/gpu_check.sh engine "$OUT"         # on the GPU machine, one part per command
    bash benchmarks/gpu_check.sh train  "$OUT"
    bash benchmarks/gpu_check.sh bench  "$OUT"

Each part runs its cases one after another, each in its own folder under OUT/<part>/<case>/ with
its log, and writes OUT/<part>.json: per case ok / failed / skipped, the figures, and the error's
last lines. A failing case does not stop the part; a part stops starting cases at its deadline.
Everything runs on the single-GPU `local` backend, without Ray, vLLM or wandb (not on the image).

engine   the bugs a first GPU run hits (issue "Ready for the first GPU"), one case each:
         environment (device, dtype choice), `pytest -m gpu`, bf16 ZeRO-0 checkpoint and resume,
         ZeRO-2 offload in rollout then checkpoint and resume, ZeRO-3 (partitioned load, sharded
         reference, gathered rollout), host memory of a checkpoint save, prefill logits memory,
         the hybrid engine's memory budget per phase, the bf16 log-prob gap between the sampler
         and the trainer (and a run on the sampler's log-probs with truncated importance sampling)
train    a tiny recipe that must learn; SmolLM2-135M- and Qwen2.5-0.5B-shaped Llamas (built here,
         random weights) in bf16 under ZeRO 0 and 2: step time, tokens/s, peak memory, finite
         loss, weights moved; `hflow eval` of a bf16 ZeRO-2 checkpoint (its scores, its peak memory)
bench    `hflow bench rollout|step|switch`, and TRL's GRPO against hflow's on the same model,
         rounds alternating (benchmarks/vs_trl.py)
account  where the GPU's time goes: torch's profiler over the update, a scoring pass and a rollout
         (benchmarks/update_profile.py: the kernels' busy share of the wall time), `hflow bench
         step` with the step as one micro-batch and on the 0.5B shape, TRL beside it on the 0.5B
         shape with activation recomputation on in both
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 540  # of the ten minutes a device command may run: the rest for set-up and the copy back
# (hidden, layers, heads, kv heads, intermediate, vocabulary), tied embeddings: the shapes of
# SmolLM2-135M-Instruct and Qwen2.5-0.5B, as Llamas (the same arithmetic per token).
SHAPES = {"smollm2-135m": (576, 30, 9, 3, 1536, 49152), "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936)}


def hflow(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hflow", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def sets(**keys) -> list[str]:
    out = []
    for key, value in keys.items():
        out += ["--set", f"{key.replace('__', '.')}={value}"]
    return out


def train(cwd: Path, recipe: str, *extra: str, timeout: float = 300) -> tuple[Path, list[dict]]:
    """`hflow train`: the run directory and its events (raises with stderr's end on failure)."""
    done = hflow("train", recipe, "--output-dir", str(cwd / "runs"), *extra, cwd=cwd, timeout=timeout)
    (cwd / "train.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"hflow train exited {done.returncode}: {done.stderr[-1500:]}")
    run = Path(done.stdout.strip().splitlines()[-1])
    return run, events(run)


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def resumed_matches(cwd: Path, recipe: str, *extra: str) -> dict:
    """Six steps with a checkpoint at 3 and 6; then the run made to look crashed after step 5 and
    resumed: steps 4-6 against the uninterrupted ones (bitwise on the CPU; on a GPU a kernel may
    sum in another order, so the largest relative gap is what is reported)."""
    run, full = train(cwd, recipe, *extra, *sets(trainer__total_steps=6, trainer__save_every=3))
    shutil.rmtree(run / "checkpoints" / "step_000006")
    lines = (run / "events.jsonl").read_text().splitlines()[:5]
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    done = hflow("train", "--resume", str(run), cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"resume exited {done.returncode}: {done.stderr[-1500:]}")
    again = events(run)
    keys = ("reward/mean", "actor/loss", "actor/grad_norm", "kl/mean")
    gap = max(abs(b[k] - a[k]) / max(abs(a[k]), 1e-6) for a, b in zip(full[3:], again[3:]) for k in keys if k in a)
    return {"steps": [e["step"] for e in again], "largest_relative_gap": gap, "ok": gap < 1e-2}


# --- engine ----------------------------------------------------------------------------------------

def case_environment(cwd: Path) -> dict:
    import torch

    from hflow.engine.groups.dist import pick_device
    from hflow.engine.models.loading import resolve_dtype

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    device = pick_device("auto")
    return {"nvidia_smi": smi.stdout.strip(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": str(device), "capability": list(torch.cuda.get_device_capability()),
            "auto_dtype": str(resolve_dtype("auto", device)), "ok": device.type == "cuda"}


def case_pytest_gpu(cwd: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=--import-mode=importlib -ra", "tests"], cwd=ROOT, capture_output=True,
                          text=True, timeout=420)
    (cwd / "pytest.log").write_text(done.stdout + done.stderr)
    return {"summary": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "", "ok": done.returncode == 0}


def case_bf16_zero0_resume(cwd: Path) -> dict:
    return resumed_matches(cwd, "grpo/quickstart", *sets(model__dtype="bfloat16", actor__zero_stage=0))


def case_offload_zero2_resume(cwd: Path) -> dict:
    return resumed_matches(cwd, "grpo/quickstart", *sets(model__dtype="bfloat16", actor__zero_stage=2,
                                                         actor__offload_in_rollout="true"))


def case_zero3(cwd: Path) -> dict:
    """Partitioned at load, the reference sharded (its KL to the actor is 0 at step 1), the rollout on
    gathered weights; then resumed."""
    out = resumed_matches(cwd, "grpo/quickstart", *sets(actor__zero_stage=3, grpo__kl_coef=0.05))
    run = sorted((cwd / "runs").iterdir())[-1]
    out["kl_step_1"] = events(run)[0]["kl/mean"]
    out["ok"] = out["ok"] and abs(out["kl_step_1"]) < 1e-6
    return out


def shaped_model(name: str, out: Path) -> Path:
    """A Llama of SHAPES[name] with random weights and the character tokenizer padded with unused
    tokens to the vocabulary's size (so every sampled id decodes)."""
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hflow.engine.models.loading import build_tiny_tokenizer

    hidden, layers, heads, kv, inter, vocab = SHAPES[name]
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens([f"<u{i}>" for i in range(vocab - len(tokenizer))])
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def case_checkpoint_host_memory(cwd: Path) -> dict:
    """Host memory a checkpoint save adds on the rank (streamed: about one tensor, not the model's
    fp32 weights and Adam moments, 12 bytes a parameter)."""
    code = f"""
import json, sys, torch
sys.path.insert(0, {str(ROOT / 'tests')!r})
from peak_memory import PeakResident
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.models.loading import load_causal_lm
from hflow.engine.training.train_engine import TrainEngine
from hflow.engine.rollout.hybrid import resident_bytes
from hflow.trainer.config.sections import ActorConfig
from hflow.trainer.placement.worker_specs import optim_spec
ensure_process_group(torch.device("cuda"))
model = load_causal_lm({str(shaped_model("qwen2.5-0.5b", cwd / "model"))!r}, torch.bfloat16).cuda()
engine = TrainEngine(model, optim_spec(ActorConfig(lr=1e-5, zero_stage=2)), 10, 2, 1, bf16=True)
ids = torch.randint(3, 1000, (2, 64), device="cuda")
engine.backward(engine.forward(input_ids=ids, labels=ids).loss); engine.step()
params = sum(p.numel() for p in model.parameters())
before = resident_bytes()
with PeakResident() as peak:
    engine.save(__import__("pathlib").Path({str(cwd / "ckpt")!r}))
print(json.dumps({{"parameters": params, "save_growth_bytes": peak.peak - before, "exact": peak.exact,
                  "full_state_bytes": 12 * params}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    (cwd / "log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1500:])
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["ok"] = out["save_growth_bytes"] < out["full_state_bytes"] / 4
    return out


def case_prefill_logits(cwd: Path) -> dict:
    """Peak GPU memory of a rollout on the Qwen2.5-0.5B shape: 32 prompts of 512 tokens, whose
    prefill logits alone would be 32 x 512 x 151,936 x 2 bytes = 5 GB without logits_to_keep."""
    import torch

    from hflow.engine.models.loading import load_causal_lm
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams

    model = load_causal_lm(str(shaped_model("qwen2.5-0.5b", cwd.parent / "model-qwen")), torch.bfloat16).cuda()
    generator = HFGenerator(model, [2], 0, 32)
    prompts = [[3 + (i * 7 + j) % 50 for j in range(512)] for i in range(32)]
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    generator.generate(prompts, 1, SamplingParams(16), torch.Generator("cuda").manual_seed(0))
    peak = torch.cuda.max_memory_allocated() - base
    full_logits = 32 * 512 * 151936 * 2
    return {"rollout_peak_bytes_above_weights": peak, "full_prefill_logits_bytes": full_logits,
            "ok": peak < full_logits}


def logprob_gap(model_dir: Path, device: str, dtype, prompts: int = 32, n: int = 4, new: int = 128) -> dict:
    """The generator's per-token log-probs (incremental decoding with a KV cache, as sampled)
    against the trainer's scoring pass over the same rows (one forward over the whole sequence):
    in bf16 the two sum in different orders, so a run that trusts the sampler's log-probs as
    pi_old (`actor.recompute_old_log_probs: false`) sees importance ratios off 1 on-policy."""
    import torch

    from hflow.engine import columns as col
    from hflow.engine.groups.batch import Batch
    from hflow.engine.models.loading import load_causal_lm
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams
    from hflow.engine.training.logprobs import response_log_probs

    model = load_causal_lm(str(model_dir), dtype).to(device)
    generator = HFGenerator(model, [2], 0, prompts * n)
    rows = [[3 + (i * 7 + j) % 50 for j in range(16 + i % 16)] for i in range(prompts)]
    out = generator.generate(rows, n, SamplingParams(new), torch.Generator(device).manual_seed(0))
    batch = Batch(dict(out)).to(device)  # the generator hands back host tensors, as to a worker
    with torch.no_grad():
        scored, _ = response_log_probs(model, batch, 1.0)
    mask = batch[col.RESPONSE_MASK].bool()
    gap = (scored - batch[col.ROLLOUT_LOG_PROBS].float())[mask].abs()
    ratio = (scored - batch[col.ROLLOUT_LOG_PROBS].float())[mask].exp()
    return {"tokens": int(mask.sum()), "mean_abs": float(gap.mean()), "max_abs": float(gap.max()),
            "ratio_outside_0.8_1.2": float(((ratio < 0.8) | (ratio > 1.2)).float().mean())}


def case_logprob_mismatch(cwd: Path) -> dict:
    """The sampler-trainer log-prob gap in bf16 on both shapes; then `grpo/quickstart` with the
    sampler's log-probs as the behaviour policy and truncated importance sampling
    (`actor.off_policy_correction: tis`): it must stay finite and learn."""
    import torch

    out = {name: logprob_gap(shaped_model(name, cwd.parent / f"model-{name}"), "cuda", torch.bfloat16)
           for name in ("smollm2-135m", "qwen2.5-0.5b")}
    _, ev = train(cwd, "grpo/quickstart", *sets(trainer__total_steps=30, trainer__save_every=0,
                                                model__dtype="bfloat16", actor__off_policy_correction="tis"))
    first, last = (sum(e["reward/mean"] for e in part) / len(part) for part in (ev[:3], ev[-5:]))
    finite = all(math.isfinite(e["actor/loss"]) for e in ev)
    out["tis_run"] = {"reward_first_3": first, "reward_last_5": last, "loss_finite": finite}
    out["ok"] = finite and last > first + 0.3
    return out


def case_switch_budget(cwd: Path) -> dict:
    model = shaped_model("smollm2-135m", cwd.parent / "model-smollm2")
    out = {}
    for label, extra in (("zero2_offload", sets(actor__zero_stage=2, actor__offload_in_rollout="true")),
                         ("zero3_gathered", sets(actor__zero_stage=3))):
        done = hflow("bench", "switch", "grpo/quickstart", "--json", "--repeats", "2",
                     *sets(model__path=model, model__init="null", model__dtype="bfloat16"), *extra, cwd=cwd)
        if done.returncode != 0:
            raise RuntimeError(f"{label}: {done.stderr[-1500:]}")
        out[label] = json.loads(done.stdout.strip().splitlines()[-1])
    rollout = out["zero3_gathered"]["ranks"][0]["phases"]
    out["ok"] = rollout["scoring"]["generator_weights_bytes"] == 0 < rollout["rollout"]["generator_weights_bytes"]
    return out


# --- train -----------------------------------------------------------------------------------------

def case_learns(cwd: Path) -> dict:
    _, ev = train(cwd, "grpo/quickstart", *sets(trainer__total_steps=30, trainer__save_every=0))
    first, last = (sum(e["reward/mean"] for e in part) / len(part) for part in (ev[:3], ev[-5:]))
    return {"reward_first_3": first, "reward_last_5": last, "ok": last > first + 0.3}


def shaped_run(cwd: Path, name: str, zero: int) -> dict:
    model = shaped_model(name, cwd.parent / f"model-{name}")
    run, ev = train(cwd, "grpo/quickstart", *sets(
        model__path=model, model__init="null", model__dtype="bfloat16", actor__zero_stage=zero,
        actor__lr=1e-5, actor__micro_batch_size=16, actor__mini_batch_size=64, rollout__n=4,
        rollout__max_response_length=64, trainer__prompts_per_step=16, trainer__total_steps=5,
        trainer__save_every=0, logging__samples_per_step=0), timeout=420)
    later = ev[1:] or ev
    moved = _weights_moved(model, run / "final")
    loss_finite = all(math.isfinite(e["actor/loss"]) for e in ev)
    return {"step_s": sorted(e["timing/step"] for e in later)[len(later) // 2],
            "tokens_per_s": sorted(e["throughput/tokens_per_s"] for e in later)[len(later) // 2],
            "peak_bytes": max(e.get("memory/peak_bytes", 0.0) for e in ev), "loss_finite": loss_finite,
            "largest_weight_change": moved, "ok": loss_finite and moved > 0}


def _weights_moved(initial: Path, final: Path) -> float:
    from safetensors.torch import load_file

    a = load_file(next(initial.glob("*.safetensors")))
    b = load_file(next(final.glob("*.safetensors")))
    return max(float((b[k].float() - a[k].float()).abs().max()) for k in a if k in b)


def case_smollm2_z0(cwd):
    return shaped_run(cwd, "smollm2-135m", 0)


def case_smollm2_z2(cwd):
    return shaped_run(cwd, "smollm2-135m", 2)


def case_qwen05_z0(cwd):
    return shaped_run(cwd, "qwen2.5-0.5b", 0)


def case_qwen05_z2(cwd):
    return shaped_run(cwd, "qwen2.5-0.5b", 2)


def case_eval_checkpoint(cwd: Path) -> dict:
    """`hflow eval` of a bf16 ZeRO-2 checkpoint on the 0.5B shape: the policy loaded for generation
    alone (no training engine), its scores against those training logged at that step, and the
    eval process's peak GPU memory against the training run's."""
    model = shaped_model("qwen2.5-0.5b", cwd.parent / "model-qwen2.5-0.5b")
    run, ev = train(cwd, "grpo/quickstart", *sets(
        model__path=model, model__init="null", model__dtype="bfloat16", actor__zero_stage=2, actor__lr=1e-5,
        rollout__n=4, rollout__max_response_length=32, trainer__prompts_per_step=8, trainer__total_steps=2,
        trainer__save_every=2, trainer__eval_every=2, data__eval="synthetic:digits", data__eval_size=16,
        logging__samples_per_step=0), timeout=420)
    probe = ("import atexit, runpy, sys, torch; atexit.register(lambda: print('PEAK', "
             "torch.cuda.max_memory_allocated(), file=sys.stderr)); sys.argv = ['hflow', *sys.argv[1:]]; "
             "runpy.run_module('hflow', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", probe, "eval", str(run / "recipe.yaml"), "--checkpoint",
                           str(run / "checkpoints" / "step_000002")], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    (cwd / "eval.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"hflow eval exited {done.returncode}: {done.stderr[-1500:]}")
    printed = {line.split()[0]: float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("eval/")}
    logged = next(e for e in ev if e["step"] == 2)
    gap = max(abs(value - logged[key]) for key, value in printed.items())
    peak = int(next(line.split()[1] for line in done.stderr.splitlines() if line.startswith("PEAK ")))
    trained_peak = max(e.get("memory/peak_bytes", 0.0) for e in ev)
    return {"printed": printed, "largest_gap_to_logged": gap, "eval_peak_bytes": peak,
            "train_peak_bytes": trained_peak, "ok": bool(printed) and peak < trained_peak}


# --- bench -----------------------------------------------------------------------------------------

SHAPED = {"smollm2-135m": "model-smollm2", "qwen2.5-0.5b": "model-qwen05"}


def shaped_sets(cwd: Path, shape: str, **keys) -> list[str]:
    """`--set`s for grpo/quickstart on a model of SHAPES[shape]: 16 prompts x 8, 64 new tokens."""
    model = shaped_model(shape, cwd.parent / SHAPED[shape])
    return sets(model__path=model, model__init="null", rollout__max_response_length=64,
                trainer__prompts_per_step=16, **keys)


def finished(done: subprocess.CompletedProcess, cwd: Path) -> str:
    """A finished command's standard output (all its output kept in cwd/log); raises if it failed."""
    (cwd / "log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1500:])
    return done.stdout


def json_result(done: subprocess.CompletedProcess, cwd: Path) -> dict:
    """The last line of a finished command's output, read as JSON."""
    return json.loads(finished(done, cwd).strip().splitlines()[-1])


def bench(cwd: Path, what: str, shape: str = "smollm2-135m", **keys) -> dict:
    return json_result(hflow("bench", what, "grpo/quickstart", "--json", "--repeats", "3",
                             *shaped_sets(cwd, shape, **keys), cwd=cwd, timeout=300), cwd)


def vs_trl(cwd: Path, shape: str, *args: str, timeout: float) -> dict:
    model = shaped_model(shape, cwd.parent / SHAPED[shape])
    return json_result(subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_trl.py"), "--model", str(model),
                                       *args, "--json"], cwd=cwd, capture_output=True, text=True, timeout=timeout),
                       cwd)


def case_bench_rollout(cwd):
    return bench(cwd, "rollout")


def case_bench_step(cwd):
    return bench(cwd, "step")


def case_bench_switch(cwd):
    return bench(cwd, "switch")


def case_vs_trl(cwd: Path) -> dict:
    return vs_trl(cwd, "smollm2-135m", "--steps", "6", "--rounds", "2", timeout=420)


# --- account: where the GPU's time goes (issue "every phase at its limit") ---------------------------

def profiled(cwd: Path, phase: str, shape: str = "smollm2-135m", **keys) -> dict:
    """benchmarks/update_profile.py on the GPU: the kernels' busy share of the phase's wall time (and
    the update's trace: a rollout's is too large to write in the part's time)."""
    trace = ["--trace", str(cwd / "trace.json")] if phase == "update" else []
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "update_profile.py"), "grpo/quickstart",
                           "--phase", phase, "--top", "25", *trace, *shaped_sets(cwd, shape, **keys)],
                          cwd=cwd, capture_output=True, text=True, timeout=240)
    lines = finished(done, cwd).splitlines()
    return {"seconds_line": next(x for x in lines if " seconds: " in x),
            "busy_line": next((x for x in lines if x.startswith("device kernels busy")), None)}


def case_profile_update(cwd):
    return profiled(cwd, "update")


def case_profile_score(cwd):
    return profiled(cwd, "score")


def case_profile_generate(cwd):
    return profiled(cwd, "generate")


def case_decode_layouts(cwd: Path) -> dict:
    """The decoding step on the GPU as rows (its layout since 2026-11-28: 698 operators a bf16
    SmolLM2 step) against as columns (1,096, the layout it had; here as a CPU's BLAS path runs it), bf16,
    32 rows, rounds alternating (`benchmarks/decode_step_ab.py --layouts`)."""
    model = shaped_model("smollm2-135m", cwd.parent / SHAPED["smollm2-135m"])
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_step_ab.py"), "--layouts", "columns,rows",
                           "--model", str(model), "--device", "cuda", "--dtype", "bfloat16", "--rows", "32",
                           "--prompt", "40", "--steps", "48", "--rounds", "6"],
                          cwd=cwd, capture_output=True, text=True, timeout=240)
    lines = finished(done, cwd).splitlines()
    medians = {line.split()[0]: float(line.split()[3]) for line in lines if "ms/step median" in line}
    return {"lines": lines[-3:], "ms_per_step": medians, "ok": set(medians) == {"columns", "rows"}}


def case_step_135m_one_micro(cwd):
    """The whole step's 128 rows as one mini- and one micro-batch: fewer, larger kernels."""
    return bench(cwd, "step", actor__mini_batch_size=128, actor__micro_batch_size=128)


def case_step_05b(cwd):
    return bench(cwd, "step", "qwen2.5-0.5b")


def case_vs_trl_05b(cwd: Path) -> dict:
    return vs_trl(cwd, "qwen2.5-0.5b", "--steps", "4", "--warmup", "1", "--rounds", "2", "--checkpointing", "on",
                  timeout=400)


PARTS = {
    "engine": [case_environment, case_pytest_gpu, case_bf16_zero0_resume, case_offload_zero2_resume, case_zero3,
               case_checkpoint_host_memory, case_prefill_logits, case_switch_budget, case_logprob_mismatch],
    "train": [case_learns, case_smollm2_z0, case_smollm2_z2, case_qwen05_z0, case_qwen05_z2, case_eval_checkpoint],
    "bench": [case_bench_rollout, case_bench_step, case_bench_switch, case_vs_trl],
    "account": [case_profile_update, case_profile_score, case_profile_generate, case_decode_layouts, case_step_05b,
                case_vs_trl_05b, case_step_135m_one_micro],
}


def run_part(part: str, out: Path, only: list[str] | None = None, deadline_s: float = DEADLINE_S) -> dict:
    start = time.monotonic()
    results = {}
    for case in PARTS[part]:
        name = case.__name__.removeprefix("case_")
        if only and name not in only:
            continue
        if time.monotonic() - start > deadline_s:
            results[name] = {"status": "skipped", "why": "the part's deadline passed"}
            continue
        folder = out / part / name
        folder.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        try:
            figures = case(folder)
            status = "ok" if figures.pop("ok", True) else "failed"
            results[name] = {"status": status, **figures}
        except Exception as err:  # recorded, and the part goes on
            results[name] = {"status": "failed", "error": f"{type(err).__name__}: {err}"[-2000:],
                             "traceback": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.monotonic() - began, 1)
        (out / f"{part}.json").write_text(json.dumps(results, indent=1, default=str))
        print(f"{part}/{name}: {results[name]['status']} ({results[name]['seconds']} s)", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=list(PARTS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", help="case names to run (default: all of the part)")
    parser.add_argument("--list", action="store_true", help="print the part's case names and stop")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help=f"seconds after which no further case starts (default {DEADLINE_S})")
    a = parser.parse_args()
    if a.list:
        print("\n".join(c.__name__.removeprefix("case_") for c in PARTS[a.part]))
        return
    os.environ.setdefault("WANDB_MODE", "disabled")
    results = run_part(a.part, a.out, a.only, a.deadline)
    failed = [n for n, r in results.items() if r["status"] == "failed"]
    print(f"{a.part}: {len(results) - len(failed)} of {len(results)} cases not failed; failed: {failed or 'none'}")


if __name__ == "__main__":
    main()
