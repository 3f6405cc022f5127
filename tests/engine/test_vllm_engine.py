"""The vllm engine.

CPU tests: a small fake standing in for vLLM's `LLM` checks hflow's own plumbing: the order of
the phase protocol calls, that the weights handed over are the trained ones, when vLLM is
woken and put to sleep, and how a tensor-parallel group shares its prompts. They say nothing
about vLLM itself.

GPU tests (`gpu` marker, skipped without a CUDA GPU or without vLLM): the real engine against
the hf engine, and the weights inside vLLM after a sync against the training weights. Each
runs in its own process (tests/vllm_gpu_checks.py): vLLM's sleep mode allows one engine per
process. They have never been run: this project's machines have no GPU that can run vLLM.
"""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from hflow.engine.batch import Batch
from hflow.engine.generation import SamplingParams
from hflow.engine.vllm_engine import VLLMGenerator

TESTS = Path(__file__).resolve().parent.parent


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeModel:
    def __init__(self, calls):
        self.calls = calls
        self.weights: dict[str, torch.Tensor] = {}

    def load_weights(self, named):
        named = list(named)
        self.calls.append(("load_weights", len(named)))
        self.weights.update({n: t.clone() for n, t in named})


class FakeLLM:
    """Records the calls hflow makes; generates `i + 1` copies of a seed-derived token, then eos."""

    instances: list["FakeLLM"] = []

    def __init__(self, eos: int = 2, **kwargs):
        import os

        self.kwargs = kwargs
        self.env = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "LOCAL_RANK")}
        self.calls: list[tuple] = [("init",)]
        self.model = FakeModel(self.calls)
        self.eos = eos
        self.requests: list[tuple[list[int], object]] = []
        FakeLLM.instances.append(self)

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))

    def apply_model(self, fn):
        return [fn(self.model)]

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append(("generate", len(prompts)))
        outputs = []
        for prompt, sp in zip(prompts, sampling_params):
            self.requests.append((prompt["prompt_token_ids"], sp))
            samples = []
            for i in range(sp.n):
                tokens = ([3 + (sp.seed + i) % 7] * (i + 1) + [self.eos])[:sp.max_tokens]
                logprobs = [{t: types.SimpleNamespace(logprob=-0.25 * (k + 1))} for k, t in enumerate(tokens)]
                samples.append(types.SimpleNamespace(index=i, token_ids=tokens, logprobs=logprobs))
            outputs.append(types.SimpleNamespace(outputs=samples[::-1]))  # any order: hflow sorts by index
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    FakeLLM.instances.clear()
    return module


def _actor(tiny_model, zero_stage=1):
    from hflow.engine.models import load_tokenizer
    from hflow.trainer.data import PromptData
    from hflow.trainer.placement import build_worker_groups
    from hflow.trainer.recipe_load import build_recipe

    recipe = build_recipe({
        "model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits", "synthetic_size": 32},
        "rollout": {"engine": "vllm", "n": 2, "max_response_length": 6, "weight_bucket_mb": 1},
        "actor": {"zero_stage": zero_stage, "micro_batch_size": 4, "mini_batch_size": 8, "lr": 0.05},
        "trainer": {"prompts_per_step": 4},
    }, {}, "test")
    groups = build_worker_groups(recipe, ["actor"], torch.device("cpu"))
    groups["actor"].init_model(total_updates=2)
    prompts = PromptData(recipe.data, load_tokenizer(str(tiny_model)), 0, 4)
    return groups["actor"], prompts


def _since(calls, start):
    """The calls after index `start`, with the bucket loads folded into one entry."""
    out = []
    for call in calls[start:]:
        if call[0] == "load_weights" and out and out[-1] == "load_weights":
            continue
        out.append(call[0] if call[0] == "load_weights" else call)
    return out


def test_phase_protocol_order_and_synced_weights(fake_vllm, tiny_model):
    """hflow's plumbing around a fake LLM: sleep at start, wake weights -> load -> wake KV cache ->
    generate, no second sync for a second rollout of the same policy, sleep before scoring, and
    the weights handed over are the current training weights (after an update too)."""
    actor, prompts = _actor(tiny_model)
    (llm,) = FakeLLM.instances
    assert llm.calls == [("init",), ("sleep", 2)]
    assert llm.env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "LOCAL_RANK": "0"}
    assert llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert llm.kwargs["load_format"] == "dummy" and llm.kwargs["enable_sleep_mode"]
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"
    module = actor.worker.train_engine.module
    actor.worker.phases.bucket_bytes = 64 << 10  # the tiny model fits one MiB: make it several buckets

    start = len(llm.calls)
    batch = actor.generate_sequences(prompts.batch(1))
    greedy = prompts.batch(1)
    greedy.meta["greedy"] = True
    actor.generate_sequences(greedy)  # ReMax's baseline: same policy, no new sync
    assert _since(llm.calls, start) == [("wake_up", ("weights",)), "load_weights", ("wake_up", ("kv_cache",)),
                                        ("generate", 4), ("generate", 4)]
    assert list(llm.model.weights) == [n for n, _ in module.named_parameters()]
    for name, param in module.named_parameters():
        assert torch.equal(llm.model.weights[name], param.detach())
    assert actor.worker.phases.last_sync.buckets > 1

    start = len(llm.calls)
    batch |= actor.compute_log_prob(batch)
    assert _since(llm.calls, start) == [("sleep", 2)]  # vLLM's memory back before scoring
    batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(0))})
    actor.update_actor(batch)
    before = {n: t.clone() for n, t in llm.model.weights.items()}

    start = len(llm.calls)
    actor.generate_sequences(prompts.batch(2))
    assert _since(llm.calls, start) == [("wake_up", ("weights",)), "load_weights", ("wake_up", ("kv_cache",)),
                                        ("generate", 4)]
    assert any(not torch.equal(before[n], p.detach()) for n, p in module.named_parameters())
    for name, param in module.named_parameters():
        assert torch.equal(llm.model.weights[name], param.detach())


def test_rollout_columns_and_sampling_settings(fake_vllm, tiny_model):
    actor, prompts = _actor(tiny_model)
    (llm,) = FakeLLM.instances
    batch = actor.generate_sequences(prompts.batch(1))
    assert len(batch) == 8 and "rollout_entropy" not in batch  # vLLM has no entropy to give
    for row in range(8):
        mask = batch["response_mask"][row].bool()
        length = int(mask.sum())
        assert length == row % 2 + 2  # sample i of the fake: i + 1 tokens, then eos
        assert batch["responses"][row][length - 1] == llm.eos
        torch.testing.assert_close(batch["rollout_log_probs"][row][mask], -0.25 * torch.arange(1, length + 1))
    prompt, sp = llm.requests[0]
    assert prompt == batch["prompt_ids"][0]
    assert (sp.n, sp.temperature, sp.top_k, sp.max_tokens, sp.logprobs, sp.detokenize) == (2, 1.0, -1, 6, 0, False)
    assert len({s.seed for _, s in llm.requests}) == len(llm.requests)  # a seed per prompt


def test_tensor_parallel_group_generates_its_whole_share_list(fake_vllm):
    """Rank 1 of a 2-rank group: vLLM gets the peer's prompts, then ours, each with its owner's
    seed, and only our rows come back."""
    llm = FakeLLM(eos=2)
    engine = VLLMGenerator(llm, [2], 0, tp_size=2, tp_rank=1)
    peer = ([[7, 7, 7], [8]], [101, 202])
    engine._gather_group = lambda share: [peer, share]
    mine = [[5, 6], [9, 9]]
    out = engine.generate(mine, 1, SamplingParams(max_new_tokens=4), torch.Generator().manual_seed(0))
    seen = [(p, sp.seed) for p, sp in llm.requests]
    assert [p for p, _ in seen] == [[7, 7, 7], [8], [5, 6], [9, 9]]
    assert [s for _, s in seen[:2]] == [101, 202]
    expected_seeds = torch.randint(0, 2**62, (2,), generator=torch.Generator().manual_seed(0)).tolist()
    assert [s for _, s in seen[2:]] == expected_seeds
    assert out["input_ids"].shape[0] == 2
    prompt_part = out["input_ids"][:, :2][out["attention_mask"][:, :2].bool()]
    assert prompt_part.tolist() == [5, 6, 9, 9]
    assert out["responses"][:, 0].tolist() == [3 + seed % 7 for seed in expected_seeds]


# --- on a GPU with vLLM ----------------------------------------------------------------------


def _gpu_check(name: str, tmp_path: Path) -> dict:
    from hflow.engine.models import build_tiny_model

    model = build_tiny_model(tmp_path / "medium", "medium")  # head size 64: what vLLM's kernels take
    out = tmp_path / f"{name}.json"
    result = subprocess.run([sys.executable, str(TESTS / "vllm_gpu_checks.py"), name, str(model), str(out)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.gpu
@pytest.mark.slow
def test_vllm_greedy_matches_hf_engine(tmp_path):
    pytest.importorskip("vllm")
    result = _gpu_check("greedy", tmp_path)
    assert result["same_tokens_rows"] == result["rows"], result
    assert result["max_logprob_diff"] < 1e-2, result


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [1, 3])
def test_vllm_weights_after_sync_equal_training_weights(tmp_path, zero_stage):
    pytest.importorskip("vllm")
    result = _gpu_check(f"sync-zero{zero_stage}", tmp_path)
    assert result["mismatched"] == [] and result["compared"] > 0, result
    assert result["mismatched_after_update"] == [] and result["changed_by_update"], result
