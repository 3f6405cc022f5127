"""GPU checks of the vllm engine, one per process (vLLM's sleep mode allows one engine per
process), run by tests/engine/test_vllm_engine.py:

  python tests/vllm_gpu_checks.py greedy|sync-zero1|sync-zero3 MODEL_DIR OUT_JSON

Float32 weights on both sides, so that greedy decoding is not decided by rounding and the
weights can be compared bit for bit.
"""

from __future__ import annotations

import json
import sys

import torch


def _actor(model: str, zero_stage: int = 1):
    from hflow.engine.models import load_tokenizer
    from hflow.trainer.data import PromptData
    from hflow.trainer.placement import build_worker_groups
    from hflow.trainer.recipe_load import build_recipe

    recipe = build_recipe({
        "model": {"path": model, "dtype": "float32"},
        "data": {"train": "synthetic:digits", "synthetic_size": 64},
        "rollout": {"engine": "vllm", "n": 2, "max_response_length": 16, "gpu_memory_utilization": 0.3,
                    "weight_bucket_mb": 8},
        "actor": {"zero_stage": zero_stage, "micro_batch_size": 8, "mini_batch_size": 16, "lr": 0.01},
        "trainer": {"prompts_per_step": 8, "device": "cuda"},
    }, {}, "gpu-check")
    groups = build_worker_groups(recipe, ["actor"], torch.device("cuda"))
    groups["actor"].init_model(total_updates=2)
    data = PromptData(recipe.data, load_tokenizer(model), 0, 8)
    return groups["actor"], data


def greedy(model: str) -> dict:
    from hflow.engine.generation import HFGenerator, SamplingParams

    actor, data = _actor(model)
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
    return {"rows": len(out), "same_tokens_rows": same, "max_logprob_diff": max(diffs, default=float("inf"))}


def _vllm_weights(worker) -> dict[str, torch.Tensor]:
    return worker.generator.llm.apply_model(
        lambda m: {n: p.detach().float().cpu().clone() for n, p in m.named_parameters()})[0]


def _training_weights(worker) -> dict[str, torch.Tensor]:
    with worker._gathered():
        return {n: p.detach().float().cpu().clone() for n, p in worker.train_engine.module.named_parameters()}


# vLLM's Llama fuses these Hugging Face tensors (in this order, along dim 0).
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _mismatches(vllm: dict, hf: dict) -> list[str]:
    bad = []
    for name, tensor in vllm.items():
        parts = next(((fused, hf_parts) for fused, hf_parts in FUSED.items() if f".{fused}." in name), None)
        if parts is None:
            expected = hf.get(name)
        else:
            fused, hf_parts = parts
            expected = torch.cat([hf[name.replace(fused, p)] for p in hf_parts])
        if expected is None or not torch.equal(tensor, expected):
            bad.append(name)
    return bad


def sync(model: str, zero_stage: int) -> dict:
    from hflow.engine.batch import Batch

    actor, data = _actor(model, zero_stage)
    worker = actor.worker
    batch = actor.generate_sequences(data.batch(1))
    vllm, hf = _vllm_weights(worker), _training_weights(worker)
    result = {"compared": len(vllm), "mismatched": _mismatches(vllm, hf)}
    batch |= actor.compute_log_prob(batch)
    batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(0))})
    actor.update_actor(batch)
    actor.generate_sequences(data.batch(2))
    hf_after = _training_weights(worker)
    result["changed_by_update"] = any(not torch.equal(hf[n], hf_after[n]) for n in hf)
    result["mismatched_after_update"] = _mismatches(_vllm_weights(worker), hf_after)
    return result


def main() -> None:
    check, model, out = sys.argv[1:4]
    result = greedy(model) if check == "greedy" else sync(model, int(check.removeprefix("sync-zero")))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
