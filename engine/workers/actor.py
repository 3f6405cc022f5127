"""The actor worker: DeepSpeed ZeRO training, and generation with the `hf` or `vllm` engine.

With `hf`, generation runs on the training engine's own module, so no second copy of the
weights exists on the device (the hybrid engine's starting point; ZeRO-3 gathers parameters
for the duration of generation). With `vllm`, a sleeping vLLM engine in this same process
receives the weights in buckets when rollout starts and frees them when it ends
(`hybrid.PhaseSwitch`, `vllm_engine.py`).

Rollout Batch produced by `generate_sequences` (N = prompts x n, P + R columns):
  input_ids, attention_mask, position_ids   (N, P + R)
  responses, response_mask, rollout_log_probs (N, R)
  every prompt column repeated n times, plus `uid` (the prompt's group id)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.dist import ensure_process_group, peak_memory_bytes
from hflow.engine.groups.worker import Worker
from hflow.engine.models.lora import adapters_off, is_lora, merged_state, save_merged
from hflow.engine.rollout import code_tool
from hflow.engine.rollout.environment import EpisodeLimits, load_env_class
from hflow.engine.rollout.episodes import EpisodeRunner
from hflow.engine.rollout.gathered_generator import GatheredGenerator
from hflow.engine.rollout.generation import HFGenerator, SamplingParams
from hflow.engine.rollout.generator_copy import GeneratorCopy
from hflow.engine.rollout.hybrid import PhaseSwitch
from hflow.engine.rollout.rollout_batch import rollout_batch, sampling_for
from hflow.engine.rollout.vllm_engine import VLLMGenerator
from hflow.engine.rollout.weight_sync import PackedBucket, bucket_count, weight_buckets
from hflow.engine.seeding import seed_update
from hflow.engine.specs import ActorSpec
from hflow.engine.training.logprobs import (batched_log_probs, can_share_prompts, ptx_loss, response_log_probs,
                                            scores_packed, trained_prefix)
from hflow.engine.training.held_prefix import HeldPrefix
from hflow.engine.rlmath.objective import ActorObjective
from hflow.engine.training.packing import global_token_count, micro_batches
from hflow.engine.training.saved_weights import load_saved_weights
from hflow.engine.training.train_engine import TrainEngine
from hflow.engine.workers.policy import LoadedPolicy, create_vllm, load_policy, to_device


class ActorWorker(Worker):
    def __init__(self, spec: ActorSpec, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)
        self.spec = spec
        self.device = torch.device(device)
        kl = spec.kl
        self.objective = ActorObjective(
            spec.policy_loss, spec.clip, spec.loss_agg_mode, spec.rollout.max_response_length,
            spec.off_policy_correction, spec.off_policy_cap, 0.0 if kl.in_reward else kl.coef, kl.estimator)
        self.train_engine = None
        self.generator = None
        self.generator_copy = None  # trainer.mode async: generates while the training module trains
        self.episodes = None  # the multi-turn runner, with `rollout.env`

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, checkpoint: str | None = None) -> None:
        """Load the policy, wrap it in DeepSpeed, and restore `checkpoint` when resuming (an evaluation
        loads the policy for generation alone: `init_generation`)."""
        s, o = self.spec, self.spec.optim
        ensure_process_group(self.device, self.rank, self.world_size)
        policy = load_policy(s, self.device)
        model, dtype, self.tokenizer = policy.model, policy.dtype, policy.tokenizer
        self.generation_dtype = dtype
        rollout_engine = self._vllm(policy)  # before DeepSpeed allocates anything
        to_device(model, self.device, dtype)
        if s.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.train_engine = TrainEngine.for_role(model, o, self.world_size, self.device, dtype)
        if checkpoint:
            self.train_engine.load(Path(checkpoint))
        self._start_phases(policy, rollout_engine, self.train_engine)

    @register(Dispatch.ONE_TO_ALL)
    def init_generation(self, checkpoint: str | None = None) -> None:
        """The policy for generation alone (an evaluation): its weights in the generation dtype, the
        checkpoint's when given (`training/saved_weights.py`), and the recipe's generator on them. No
        DeepSpeed engine, gradients or optimizer state: under bfloat16 and ZeRO-1/2 those hold about
        seven times the weights' memory, which an evaluation never uses. Under ZeRO-3 each rank keeps
        its partition, as in training. Only generation runs on it."""
        ensure_process_group(self.device, self.rank, self.world_size)
        policy = load_policy(self.spec, self.device)
        model, self.tokenizer, self.generation_dtype = policy.model, policy.tokenizer, policy.dtype
        if checkpoint:
            load_saved_weights(model, Path(checkpoint))
        model.requires_grad_(False)
        model.eval()
        rollout_engine = self._vllm(policy)  # before the weights take device memory
        to_device(model, self.device, policy.dtype)
        self._start_phases(policy, rollout_engine, None)

    def _vllm(self, policy: LoadedPolicy) -> VLLMGenerator | None:
        """The vLLM engine of `rollout.engine: vllm` (`policy.create_vllm`), else None."""
        if self.spec.rollout.engine != "vllm":
            return None
        return create_vllm(self.spec, self.rank, self.world_size, self.device, policy.dtype, policy.eos,
                           policy.tokenizer.pad_token_id, policy.model.config)

    def _start_phases(self, policy: LoadedPolicy, rollout_engine, train_engine) -> None:
        """The phase switch and the generator over the policy's module (the one `train_engine` wraps,
        or, with `train_engine` None, a policy for generation alone), and the episode runner."""
        s, module = self.spec, policy.model
        pad, zero3 = policy.tokenizer.pad_token_id, s.optim.zero_stage == 3
        if rollout_engine is None and zero3:
            # ZeRO-3: whole weights for the rollout, gathered once per switch (`gathered_generator.py`).
            rollout_engine = GatheredGenerator(module, self.device, policy.dtype, policy.eos, pad, s.rollout.batch_size)
        self.phases = PhaseSwitch(train_engine, self.device, rollout_engine,
                                  bucket_bytes=s.rollout.weight_bucket_mb << 20, dtype=policy.dtype,
                                  offload=s.offload_in_rollout, module=module, zero3=zero3)
        # Without a rollout engine of its own, the generator runs on the module itself: no second copy
        # of the weights.
        self.generator = rollout_engine or HFGenerator(module, policy.eos, pad, s.rollout.batch_size)
        self.episodes = self._episode_runner()

    def _episode_runner(self) -> EpisodeRunner | None:
        """Multi-turn episodes against `rollout.env`, loaded here by its import path."""
        r = self.spec.rollout
        if not r.env:
            return None
        # Where the environment's model-written code runs (`code_tool.py`): the recipe's `tools` section.
        code_tool.configure(code_tool.SandboxSettings(r.sandbox, r.sandbox_url))
        limits = EpisodeLimits(r.max_turns, r.max_response_length, r.episode_timeout_s, r.turn_discount,
                               r.max_turn_tokens, r.max_prompt_length)
        return EpisodeRunner(self.generator, self.tokenizer, load_env_class(r.env), r.env, limits)

    def _gathered(self):
        """Full parameters at once (for export only): a no-op below ZeRO-3."""
        if self.spec.optim.zero_stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.train_engine.module.parameters()))

    @register(Dispatch.DP_COMPUTE)
    def generate_sequences(self, prompts: Batch) -> Batch:
        """Sample `rollout.n` responses for each row's `prompt_ids` (see the module docstring)."""
        params, n, rng = self._sampling(prompts)
        evaluation = prompts.meta.get("eval")
        self.phases.to_rollout()  # vllm: offload the training state, sync the weights, wake the KV cache
        out = self._rollout(prompts, n, params, rng)
        if evaluation:
            self.phases.to_train()  # evaluation runs between steps: the checkpoint that may follow needs training state
        return self._rollout_batch(prompts, out, n)

    @register(Dispatch.ONE_TO_ALL)
    def end_rollout(self) -> None:
        """The step's generation is over: a generator with weights of its own (vLLM, ZeRO-3's gathered
        copy) gives its memory back before colocated models score the step; the training state
        returns at the next training call (`PhaseSwitch.to_scoring`)."""
        self.phases.to_scoring()

    @register(Dispatch.DP_COMPUTE)
    def generate_async(self, prompts: Batch) -> Batch:
        """`generate_sequences` on the generator copy (`trainer.mode: async`), which leaves the
        training module alone, so an update may run meanwhile; every row gets the copy's policy
        version (`col.POLICY_VERSION`). The same seeds as `generate_sequences`: with the same
        weights, the same rollout."""
        params, n, rng = self._sampling(prompts)
        out, version = self.generator_copy.generate(prompts[col.PROMPT_IDS], n, params, rng)
        out[col.POLICY_VERSION] = torch.full((len(out[col.RESPONSES]),), version, dtype=torch.long)
        return self._rollout_batch(prompts, out, n)

    @register(Dispatch.ONE_TO_ALL)
    def refresh_generator(self, version: int) -> dict[str, float]:
        """The training weights into the generator copy (built at the first call), which now holds
        policy `version`."""
        if self.generator_copy is None:
            m, r = self.spec.model, self.spec.rollout
            self.generator_copy = GeneratorCopy(m.path, m.trust_remote_code, self.device, self.generation_dtype,
                                                self.tokenizer, r.batch_size, r.weight_bucket_mb << 20)
        stats = self.generator_copy.refresh(self.train_engine.module, version,
                                            zero3=self.spec.optim.zero_stage == 3)
        return {"seconds": stats.seconds, "bytes": float(stats.bytes)}

    @register(Dispatch.RANK_ZERO)
    def open_weight_stream(self) -> int:
        """Start handing the training weights out bucket by bucket (`weight_sync.weight_buckets`),
        to the rollout group of asynchronous mode on its own pool; the number of buckets. Every
        rank takes part (ZeRO-3 gathers each bucket over the group); rank 0's buckets are sent."""
        r, module = self.spec.rollout, self.train_engine.module
        self._outgoing = weight_buckets(module, r.weight_bucket_mb << 20, self.generation_dtype,
                                        zero3=self.spec.optim.zero_stage == 3)
        self._outgoing_left = bucket_count(module, r.weight_bucket_mb << 20, self.generation_dtype)
        return self._outgoing_left

    @register(Dispatch.RANK_ZERO_FUTURE)
    def next_weight_bucket(self) -> PackedBucket | None:
        """The next bucket of `open_weight_stream`, packed into one host tensor (rank 0's)."""
        bucket = next(self._outgoing)
        sent = PackedBucket.pack(bucket) if self.rank == 0 else None
        self._outgoing_left -= 1
        if not self._outgoing_left:
            self._outgoing.close()  # the last bucket: under ZeRO-3 it is partitioned again now
        return sent

    @register(Dispatch.ONE_TO_ALL)
    def cancel_generation(self) -> None:
        """Stop the generator copy's generation in progress at its next token (the run is ending)."""
        if self.generator_copy is not None:
            self.generator_copy.cancel()

    def _sampling(self, prompts: Batch) -> tuple[SamplingParams, int, torch.Generator]:
        return sampling_for(prompts, self.spec.rollout, self.spec.seed, self.rank, self.device)

    def _rollout_batch(self, prompts: Batch, out: dict, n: int) -> Batch:
        return rollout_batch(prompts, out, n, self.spec.recompute_old_log_probs, self.world_size,
                             self.generator.pad, self.device)

    def _rollout(self, prompts: Batch, n: int, params: SamplingParams, rng) -> dict:
        if self.episodes is None:
            return self.generator.generate(prompts[col.PROMPT_IDS], n, params, rng)
        data = [k for k in prompts.columns if k not in (col.PROMPT_IDS, col.UID)]
        rows = [{k: prompts[k][i] for k in data} for i in range(len(prompts))]
        return self.episodes.run(rows, prompts[col.PROMPT_IDS], n, params, rng)

    @register(Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """The current (pre-update) policy's log-probs of the responses, and its entropy."""
        # Rollout is over: the generator's memory goes back before this forward and the colocated
        # roles; the training state stays off the device until the update (`PhaseSwitch.to_scoring`).
        self.phases.to_scoring()
        model = self.train_engine.module
        was_training = model.training
        model.eval()  # score as the rollout sampled: no dropout
        try:
            log_probs, entropy = batched_log_probs(model, batch.to(self.device), self.spec.rollout.temperature,
                                                   self.spec.optim.score_micro_batch_size, with_entropy=True,
                                                   zero3=self.spec.optim.zero_stage == 3)
        finally:
            model.train(was_training)
        return Batch({col.OLD_LOG_PROBS: log_probs.cpu(), col.ENTROPY: entropy.cpu()})

    @register(Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """The reference's log-probs, served by the actor when it trains LoRA adapters: its own frozen
        base weights with the adapters switched off are the initial policy (no second model)."""
        self.phases.to_scoring()
        model = self.train_engine.module
        was_training = model.training
        model.eval()
        try:
            with adapters_off(model):
                log_probs, _ = batched_log_probs(model, batch.to(self.device), self.spec.rollout.temperature,
                                                 self.spec.optim.score_micro_batch_size,
                                                 zero3=self.spec.optim.zero_stage == 3)
        finally:
            model.train(was_training)
        return Batch({col.REF_LOG_PROBS: log_probs.cpu()})

    @register(Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch, first_mini_batch: int = 0) -> dict[str, float]:
        """Policy update: epochs x mini-batches, each one optimizer step (`trainer.stream_updates`: one
        call per mini-batch, numbered from `first_mini_batch`, so its dropout seeds are the same)."""
        o, kl = self.spec.optim, self.spec.kl
        local_mini = o.mini_batch_size // self.world_size
        use_kl = kl.coef > 0 and not kl.in_reward and col.REF_LOG_PROBS in batch
        sums: dict[str, list[float]] = {}
        trained = 0  # tokens through forward and backward on this rank (for FLOP/s)
        self.phases.to_train()
        step, minis = int(batch.meta.get("step", 0)), [m for _ in range(o.epochs) for m in batch.split(local_mini)]
        lockstep = o.zero_stage == 3 and self.world_size > 1
        share = can_share_prompts(self.train_engine.forward, lockstep)
        packed = scores_packed(self.train_engine.forward, lockstep)
        for index, mini in enumerate(minis, first_mini_batch):
            seed_update(self.spec.seed, "actor-update", step, self.rank, index)
            tokens = self._loss_divisor(mini[col.RESPONSE_MASK])
            micros = micro_batches(mini, o.micro_batch_size, o.micro_batch_tokens, self.world_size, self.device,
                                   share_prompts=share, zero3=o.zero_stage == 3, packed=packed)
            # The prompts' common prefix runs once for all the micro-batches, its backward in the last's.
            held = trained_prefix(self.train_engine.forward, mini, micros)
            micro_stats = []
            for i, micro in enumerate(micros):
                self.train_engine.set_boundary(i == len(micros) - 1)
                micro_stats.append(self._micro_step(micro.to(self.device), tokens, use_kl, held))
                trained += int(micro[col.ATTENTION_MASK].sum())
            if held is not None and not held.flowed:
                raise RuntimeError("the update's held prompt prefix got no gradients: its micro-batches' "
                                   "gradients would miss the prefix's share")
            for k in micro_stats[-1]:
                values = [s[k] for s in micro_stats if k in s]
                # Losses are already shares of the mini-batch mean: they add up.
                summed = k in ("loss", "pg_loss", "ptx_loss")
                sums.setdefault(k, []).append(sum(values) if summed else sum(values) / len(values))
        metrics = {f"actor/{k}": sum(v) / len(v) for k, v in sums.items() if k != "grad_norm"}
        metrics["actor/grad_norm"] = sum(sums["grad_norm"]) / len(sums["grad_norm"])
        metrics["actor/lr"] = self.train_engine.lr
        metrics["memory/peak_bytes"] = float(peak_memory_bytes(self.device))
        metrics["tokens/trained"] = float(trained)
        return metrics

    def _loss_divisor(self, mask: torch.Tensor) -> float:
        """What a mini-batch's loss is divided by, over the whole data-parallel group: its response
        tokens (token-mean), else its sequences with a response token (the seq-mean modes, GSPO)."""
        if self.objective.per_token:
            return global_token_count(mask, self.world_size, self.device)
        return global_token_count((mask.sum(-1) > 0).float(), self.world_size, self.device)

    def _micro_step(self, micro: Batch, divisor: float, use_kl: bool,
                    held: HeldPrefix | None = None) -> dict[str, float]:
        s = self.spec
        mask = micro[col.RESPONSE_MASK].float()
        log_probs, _ = response_log_probs(self.train_engine.forward, micro, s.rollout.temperature, held=held)
        # DeepSpeed averages gradients over ranks, so each rank's share of the global token (or
        # sequence) count is scaled up by the world size: the update is the same for any DP size.
        loss, stats = self.objective(
            log_probs, micro[col.OLD_LOG_PROBS], micro[col.ADVANTAGES], mask, divisor / self.world_size,
            behaviour_log_probs=micro[col.ROLLOUT_LOG_PROBS] if s.off_policy_correction != "none" else None,
            ref_log_probs=micro[col.REF_LOG_PROBS] if use_kl else None)
        if col.PTX_INPUT_IDS in micro:  # InstructGPT's PPO-ptx: keep the pretraining likelihood up
            ptx = ptx_loss(self.train_engine.forward, micro, s.optim.mini_batch_size // self.world_size)
            loss = loss + s.ptx_coef * ptx
            stats["ptx_loss"] = float(ptx)
        self.train_engine.backward(loss)
        stats["loss"] = float(loss.detach())
        grad_norm = self.train_engine.step()
        if grad_norm is not None:
            stats["grad_norm"] = grad_norm
        return stats

    @register(Dispatch.ONE_TO_ALL)
    def measure_switch(self) -> dict[str, float]:
        """Time and memory of one train -> rollout -> train switch on this rank (`hflow bench switch`)."""
        self.phases.to_train()
        return self.phases.measure()

    @register(Dispatch.ONE_TO_ALL)
    def rollout_weight_drift(self) -> float:
        """Largest |difference| between the weights the rollout engine holds now and the training
        weights, read back from the engine's own model on this rank: 0.0 right after a sync means
        it is exact. The hf engine generates from the training weights themselves (0.0)."""
        engine = self.phases.rollout_engine
        if engine is None:
            return 0.0
        with self._gathered():
            state = {n: p.detach().clone() for n, p in merged_state(self.train_engine.module)}
        return engine.drift_from(state)

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        self.phases.to_train()  # a step without an update (skipped) may end with the training state off
        self.train_engine.save(Path(directory), self.rank)

    @register(Dispatch.RANK_ZERO)
    def export_weights(self, directory: str) -> None:
        """The current policy as a Hugging Face model directory (config, tokenizer, safetensors); with
        LoRA, the merged weights, and the adapters in `adapter/` (`lora.save_merged`)."""
        with self._gathered():
            if self.rank == 0:
                module = self.train_engine.module
                if is_lora(module):
                    save_merged(module, directory)
                else:
                    module.save_pretrained(directory, safe_serialization=True)
                self.tokenizer.save_pretrained(directory)

