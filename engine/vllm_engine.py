"""The `vllm` generation engine: vLLM running inside the actor's own ranks (SPMD), on the GPUs
that DeepSpeed trains on.

Every actor rank builds one `vllm.LLM` with `distributed_executor_backend="external_launcher"`:
no extra processes, vLLM joins the actor's torch.distributed world and splits it into
tensor-parallel groups of `rollout.tensor_parallel_size` consecutive ranks. It starts with
`load_format="dummy"` (random weights, no checkpoint read: the real ones come from the
training engine) and `enable_sleep_mode=True`, and is put to sleep at once. Phase protocol,
driven by `hybrid.PhaseSwitch`:

  train -> rollout   wake_up(tags=["weights"])          weight memory back (contents undefined)
                     weight_sync buckets -> model.load_weights   the actor's current weights
                     wake_up(tags=["kv_cache"])         KV cache back, only now: during the
                                                        sync it would just sit next to a bucket
  rollout            generate(...)
  rollout -> train   sleep(level=2)                     weights and KV cache released

Level 2, not 1: level 1 copies the weights to CPU memory so that a wake-up can restore them,
but every wake-up here overwrites them with the updated policy, so that copy would be wasted
time and host memory. (vLLM's worker saves and restores the model's buffers, e.g. rotary
tables, around a level-2 sleep; `load_weights` covers the parameters.)

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

vLLM API used, checked against vLLM's source (vllm-project/vllm: entrypoints/llm.py,
v1/executor/uniproc_executor.py, v1/worker/gpu_worker.py and worker_base.py,
v1/sample/sampler.py, v1/engine/parallel_sampling.py, 2025-2026 main branch) and the
v0.32.0 engine-argument docs (the version docker/constraints.txt locks); `logprobs_mode`
came in 0.10.0 and its final "processed" values in 0.10.2, hence `vllm>=0.10.2`:
  LLM(model, dtype, seed, tensor_parallel_size, gpu_memory_utilization, enforce_eager,
      trust_remote_code, max_model_len, max_num_seqs, distributed_executor_backend,
      load_format, enable_sleep_mode, logprobs_mode, generation_config, disable_custom_all_reduce)
  LLM.generate(list[TokensPrompt], list[SamplingParams], use_tqdm=False) -> list[RequestOutput]
      in prompt order; RequestOutput.outputs[i].index / .token_ids / .logprobs[t][token].logprob
  LLM.sleep(level=2), LLM.wake_up(tags=[...]), LLM.apply_model(fn) -> [fn(model)]
  model.load_weights(iterable of (HF name, tensor)): each loader keeps its TP slice
  SamplingParams(n, temperature, top_p, top_k, max_tokens, logprobs, seed, stop_token_ids,
      detokenize); prompts as TokensPrompt dicts {"prompt_token_ids": [...]}
  environment: VLLM_ENABLE_V1_MULTIPROCESSING=0 (the external launcher asserts it), RANK,
      LOCAL_RANK (vLLM uses cuda:LOCAL_RANK), MASTER_ADDR/PORT (an existing group is reused)
This module was never run against a real vLLM here (no GPU, vLLM not installable): the
`gpu`-marked tests in tests/engine/test_vllm_engine.py are the first thing to run on a GPU.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
from typing import Any, Callable

import torch
from packaging.version import Version

from hflow.engine.generation import SamplingParams
from hflow.engine.rollout_output import assemble_rollout, pad_rows
from hflow.engine.weight_sync import Consumer, SyncStats

MIN_VERSION = Version("0.10.2")


def unavailable_reason() -> str | None:
    """Why this machine cannot run the vllm engine (one phrase), or None. Imports nothing heavy."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = None  # an importable source tree without metadata: let it try
    if version is not None and Version(version).release < MIN_VERSION.release:
        return f"vLLM {version} is older than {MIN_VERSION}"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (vLLM generates on CUDA GPUs only)"
    return None


class VLLMGenerator:
    """`generate(prompts, n, params, generator) -> dict` like `HFGenerator`, on a sleeping
    `vllm.LLM` that `PhaseSwitch` wakes with fresh weights (`load_weights`) and puts back to
    sleep (`release`). Build it with `VLLMGenerator.create`; the constructor takes any object
    with LLM's methods (the call-order test passes a fake)."""

    def __init__(self, llm, eos_token_ids: list[int], pad_token_id: int, tp_size: int = 1, tp_rank: int = 0,
                 tp_group=None):
        self.llm = llm
        self.eos = sorted(set(eos_token_ids))
        self.pad = pad_token_id
        self.tp_size, self.tp_rank, self.tp_group = tp_size, tp_rank, tp_group

    @classmethod
    def create(cls, model_path: str, *, dtype: torch.dtype, eos_token_ids: list[int], pad_token_id: int,
               max_model_len: int, batch_size: int, tensor_parallel_size: int, gpu_memory_utilization: float,
               enforce_eager: bool, trust_remote_code: bool, seed: int, rank: int, world_size: int,
               device: torch.device) -> "VLLMGenerator":
        """A sleeping vLLM engine on this rank. Collective: every actor rank calls it together,
        after torch.distributed is up (vLLM reuses the existing group)."""
        # The external launcher needs the engine core in this process (asserted by vLLM), and
        # each rank must be one vLLM worker on this process's GPU.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        index = device.index if device.index is not None else (
            torch.cuda.current_device() if device.type == "cuda" else 0)
        group = _tp_group(rank, world_size, tensor_parallel_size)
        with _environ(RANK=str(rank), LOCAL_RANK=str(index)):
            llm = LLM(
                model=model_path,
                dtype=str(dtype).removeprefix("torch."),
                seed=seed,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                enforce_eager=enforce_eager,
                trust_remote_code=trust_remote_code,
                max_model_len=max_model_len,
                max_num_seqs=batch_size,
                distributed_executor_backend="external_launcher",
                load_format="dummy",
                enable_sleep_mode=True,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",  # sampling settings come from the recipe only
                disable_custom_all_reduce=True,
            )
        llm.sleep(level=2)  # dummy weights: nothing worth keeping until the first sync
        return cls(llm, eos_token_ids, pad_token_id, tensor_parallel_size, rank % tensor_parallel_size, group)

    # --- phase protocol (called by hybrid.PhaseSwitch) ---------------------------------

    def load_weights(self, stream: Callable[[Consumer], SyncStats]) -> SyncStats:
        """Wake the weights, fill them bucket by bucket from `stream`, then wake the KV cache."""
        self.llm.wake_up(tags=["weights"])
        stats = stream(self._load_bucket)
        self.llm.wake_up(tags=["kv_cache"])
        return stats

    def release(self) -> None:
        """Give the GPU memory back to training: weights and KV cache are discarded."""
        self.llm.sleep(level=2)

    def _load_bucket(self, named: list[tuple[str, torch.Tensor]]) -> None:
        # vLLM's loaders copy each tensor (their TP slice of it) into the model's own parameters,
        # and map HF names onto fused ones (q/k/v -> qkv_proj, gate/up -> gate_up_proj).
        self.llm.apply_model(lambda model: model.load_weights(named))

    # --- generation --------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """`n` samples per prompt, grouped by prompt (see rollout_output.py for shapes); the columns
        are HFGenerator's without `rollout_entropy`."""
        # The actor's generator lives on its device (a CUDA generator with this engine).
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
