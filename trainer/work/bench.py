"""Measurements behind `hflow bench`: rollout, full RL step, and the actor's phase switch.

Each returns a JSON-able dict. Throughput follows the HybridFlow paper: prompt + response
tokens of the global batch divided by the wall time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Callable

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dist import pick_device
from hflow.engine.groups.worker import resolve
from hflow.engine.models.loading import load_tokenizer
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.work.bench_account import account, matmul_rate
from hflow.trainer.placement.cpu_share import share_for
from hflow.trainer.placement.worker_groups import build_worker_groups
from hflow.trainer.data.prompts import PromptData
from hflow.trainer.rundir.writer import RunDir


def _actor(recipe: Recipe):
    device = pick_device(recipe.trainer.device)
    groups = build_worker_groups(recipe, ["actor"], device)
    groups["actor"].init_model()
    data = PromptData(recipe.data, load_tokenizer(recipe.model.path, recipe.model.trust_remote_code),
                      recipe.seed, recipe.trainer.prompts_per_step)
    return groups, data


def _parameter_count(recipe: Recipe) -> int:
    import json
    from pathlib import Path

    config = json.loads((Path(recipe.model.path) / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    attention = hidden * hidden * 2 + 2 * hidden * (hidden // heads) * kv
    return layers * (attention + 3 * hidden * inter) + 2 * vocab * hidden


def bench_rollout(recipe: Recipe, repeats: int) -> dict:
    """Generation alone: response tokens per second over `repeats` timed rollouts (after a warm-up),
    each on the thread share a training step would take (`cpu_share.py`; on torch's fixed count with
    libgomp's long spin they cost most beside a busy process)."""
    groups, data = _actor(recipe)
    cpu = None
    try:
        cpu = share_for(recipe, groups.backend, pick_device(recipe.trainer.device))
        actor = groups["actor"]
        cpu.before_step()
        resolve(actor.generate_sequences(data.batch(1)))
        rows, threads = [], []
        for step in range(2, repeats + 2):
            threads.append(cpu.before_step().get("cpu/threads"))
            start = time.perf_counter()
            out = resolve(actor.generate_sequences(data.batch(step)))
            seconds = time.perf_counter() - start
            rows.append((seconds, float(out[col.RESPONSE_MASK].sum()), float(out[col.ATTENTION_MASK].sum())))
    finally:
        if cpu is not None:
            cpu.restore()
        groups.shutdown()
    seconds = statistics.median(r[0] for r in rows)
    response = statistics.median(r[1] / r[0] for r in rows)
    shared = {"threads": statistics.median(threads)} if None not in threads else {}  # the share's, where it ran
    return {"sequences": len(out), "rollout_s": seconds, "response_tokens_per_s": response,
            "tokens_per_s": statistics.median(r[2] / r[0] for r in rows), **shared}


def bench_step(recipe: Recipe, steps: int, train: Callable[[Recipe, RunDir], None]) -> dict:
    """Full RL steps of the recipe's algorithm, run by `train` (its program, which the caller
    looks up: the algorithms sit above this layer); medians over the steps after the first, and
    the efficiency account of each phase (`bench_account.py`)."""
    recipe.trainer.total_steps = steps
    recipe.trainer.save_every = 0
    recipe.logging.samples_per_step = 0
    recipe.logging.progress = "lines"
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir.create(recipe, tmp)
        try:
            train(recipe, run)
        finally:
            run.close()
        events = run.events()[1:] or run.events()
    stages = sorted({k for e in events for k in e if k.startswith("timing/")})
    params = _parameter_count(recipe)
    acct = account(events, recipe)
    return {
        "actor_update_flops_per_s": update_flops(events),
        "actor_update_nominal_flops_per_s": nominal_update_flops(events, params),
        # on the recipe's device and in its dtype (a GPU's bf16, not the host's fp32)
        "matmul_peak_flops_per_s": acct["peaks"]["matmul_1024_flops_per_s"],
        "matmul_peak_dtype": acct["peaks"]["dtype"],
        "steps": len(events),
        "tokens_per_s": statistics.median(e["throughput/tokens_per_s"] for e in events),
        "step_s": statistics.median(e["timing/step"] for e in events),
        "stages_s": {k.removeprefix("timing/"): statistics.median(e.get(k, 0.0) for e in events) for k in stages},
        "peak_bytes": max(e.get("memory/peak_bytes", 0.0) for e in events),
        "account": acct,
    }


def matmul_peak_flops(size: int = 1024) -> float:
    """This host's measured fp32 matrix-product rate on the CPU (FLOP/s): the best of torch's BLAS
    and oneDNN (`bench_account.matmul_rate`)."""
    return matmul_rate(size, size, size, torch.device("cpu"), torch.float32)


def update_flops(events: list[dict]) -> float:
    """Achieved FLOP/s of the actor update: the FLOPs its engine's meter counted (what it computed:
    each shared prompt once, padding included) over the update's time, median over steps."""
    return _update_rate(events, lambda e: e.get("work/update_actor/computed_flops"))


def nominal_update_flops(events: list[dict], params: int) -> float:
    """The update's nominal FLOP/s: 6 x parameters x trained tokens (forward + backward, Kaplan et
    al. 2020) over its time, as if every row ran its own prompt. With prompts shared it exceeds the
    achieved rate, and can exceed the machine's peak: a rate for comparing with tools that count
    this way, not a share of the machine."""
    return _update_rate(events, lambda e: 6 * params * e.get("tokens/trained", 0.0))


def _update_rate(events: list[dict], flops: Callable[[dict], float | None]) -> float:
    """Median over the steps that have both of `flops(event)` over the update's time."""
    rates = [flops(e) / e["timing/update_actor"] for e in events if e.get("timing/update_actor") and flops(e)]
    return statistics.median(rates) if rates else float("nan")


def bench_switch(recipe: Recipe, repeats: int) -> dict:
    """train -> generate -> score -> train: switch times, and each rank's memory budget per phase
    (`PhaseSwitch.measure`: what the device holds in training, in rollout with the generator awake,
    in scoring with it asleep)."""
    groups, data = _actor(recipe)
    cpu = None
    try:
        cpu = share_for(recipe, groups.backend, pick_device(recipe.trainer.device))  # as `bench_rollout`
        actor = groups["actor"]
        cpu.before_step()
        batch = resolve(actor.generate_sequences(data.batch(1)))
        batch = batch | resolve(actor.compute_log_prob(batch))

        batch = batch | Batch({col.ADVANTAGES: torch.zeros(len(batch))})
        resolve(actor.update_actor(batch))
        rows = [actor.measure_switch() for _ in range(repeats)]
    finally:
        if cpu is not None:
            cpu.restore()
        groups.shutdown()
    per_rank = [list(r) if isinstance(r, list) else [r] for r in rows]
    to_rollout = statistics.median(max(x["to_rollout_s"] for x in r) for r in per_rank)
    to_train = statistics.median(max(x["to_train_s"] for x in r) for r in per_rank)
    last = per_rank[-1]
    to_scoring = statistics.median(max(x["to_scoring_s"] for x in r) for r in per_rank)
    return {
        "to_rollout_s": to_rollout,
        "to_scoring_s": to_scoring,
        "to_train_s": to_train,
        "switch_s": to_rollout + to_scoring + to_train,
        "ranks": [{k: v for k, v in x.items() if k.endswith("bytes") or k == "phases"} for x in last],
    }
