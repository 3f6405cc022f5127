"""The critic workers: value models trained with DeepSpeed ZeRO, saved and resumed like the actor.

`CriticWorker` is PPO's (and Safe-RLHF's reward) critic; `CostCriticWorker` is Safe-RLHF's
cost critic. They differ only in where their weights start and which columns they read
and write:

  compute_values:  (N, P + R) rollout  ->  values (N, R): V(s_t), the value of the state
                   before response token t (the head's output one position before it)
  update_critic:   reads values (old), returns (N, R), response_mask; clipped value loss
"""

from __future__ import annotations

from pathlib import Path

import torch

from hflow.engine import columns as col
from hflow.engine import work_meter
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.groups.worker import Worker
from hflow.engine.models.loading import resolve_dtype
from hflow.engine.models.lora import apply_lora
from hflow.engine.models.score_model import load_score_model
from hflow.engine.seeding import seed_update
from hflow.engine.specs import CriticSpec
from hflow.engine.rlmath.value import value_loss
from hflow.engine.training.packing import global_token_count, micro_batches
from hflow.engine.training.train_engine import TrainEngine
from hflow.engine.training.zero3 import is_partitioned, partitioned_load


class CriticWorker(Worker):
    values_key, returns_key, prefix = col.VALUES, col.RETURNS, "critic"

    def __init__(self, spec: CriticSpec, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)
        self.spec = spec
        self.device = torch.device(device)
        self.train_engine = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, checkpoint: str | None = None) -> None:
        """Load the value model, wrap it in DeepSpeed, and restore `checkpoint` when resuming."""
        m, o = self.spec.model, self.spec.optim
        ensure_process_group(self.device, self.rank, self.world_size)
        dtype = resolve_dtype(m.dtype, self.device)
        zero3 = o.zero_stage == 3
        with partitioned_load(o.zero_stage, dtype):  # ZeRO-3: each rank loads its partition (`zero3.py`)
            model = load_score_model(m.path, dtype if zero3 else torch.float32, m.trust_remote_code,
                                     self.spec.seed, self.prefix)
        if self.spec.lora is not None:
            # Adapters on the backbone; the value head is new (or the reward model's) and trains whole.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.spec.seed)
                model.backbone = apply_lora(model.backbone, self.spec.lora, "critic", m.path, causal_lm=False)
            if m.gradient_checkpointing:
                model.backbone.enable_input_require_grads()
        work_meter.attach(model, self.prefix)  # what its passes compute, per phase (`work_meter.py`)
        if is_partitioned(model):
            model.to(self.device)  # the head alone: zero.Init placed the backbone's partitions
        else:
            model.to(device=self.device, dtype=dtype)
        if m.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.train_engine = TrainEngine.for_role(model, o, self.world_size, self.device, dtype)
        if checkpoint:
            self.train_engine.load(Path(checkpoint))

    def _values(self, forward, batch: Batch) -> torch.Tensor:
        width = batch[col.RESPONSES].shape[1]
        scores = forward(input_ids=batch[col.INPUT_IDS], attention_mask=batch[col.ATTENTION_MASK],
                         position_ids=batch[col.POSITION_IDS])
        # The head's output at the position before response token t values the state it is sampled from.
        return scores[:, -width - 1:-1] * batch[col.RESPONSE_MASK]

    @register(Dispatch.DP_COMPUTE)
    @torch.no_grad()
    def compute_values(self, batch: Batch) -> Batch:
        module = self.train_engine.module
        module.eval()
        parts = [self._values(module, micro.to(self.device)).cpu()
                 for micro in batch.split(self.spec.optim.score_micro_batch_size)]
        return Batch({self.values_key: torch.cat(parts)})

    @register(Dispatch.DP_COMPUTE)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """Epochs x mini-batches of the clipped value loss, each mini-batch one optimizer step."""
        cfg = self.spec.optim
        local_mini = cfg.mini_batch_size // self.world_size
        self.train_engine.module.train()
        seed_update(self.spec.seed, f"{self.prefix}-update", int(batch.meta.get("step", 0)), self.rank)
        sums: dict[str, list[float]] = {}
        for _ in range(cfg.epochs):
            for mini in batch.split(local_mini):
                tokens = global_token_count(mini[col.RESPONSE_MASK], self.world_size, self.device)
                micros = micro_batches(mini, cfg.micro_batch_size, cfg.micro_batch_tokens, self.world_size,
                                       self.device)
                stats = []
                for i, micro in enumerate(micros):
                    self.train_engine.set_boundary(i == len(micros) - 1)
                    stats.append(self._micro_step(micro.to(self.device), tokens))
                sums.setdefault("loss", []).append(sum(s["loss"] for s in stats))
                for key in ("clipfrac", "vpred_mean"):
                    sums.setdefault(key, []).append(sum(s[key] for s in stats) / len(stats))
                sums.setdefault("grad_norm", []).append(stats[-1]["grad_norm"])
        metrics = {f"{self.prefix}/{k}": sum(v) / len(v) for k, v in sums.items()}
        metrics[f"{self.prefix}/lr"] = self.train_engine.lr
        return metrics

    def _micro_step(self, micro: Batch, tokens: float) -> dict[str, float]:
        values = self._values(self.train_engine.forward, micro)
        # Shares of the mini-batch's token mean, scaled by the world size as DeepSpeed averages ranks.
        loss, stats = value_loss(values, micro[self.values_key], micro[self.returns_key], micro[col.RESPONSE_MASK],
                                 self.spec.value_clip, normalizer=tokens / self.world_size)
        self.train_engine.backward(loss)
        grad_norm = self.train_engine.step()
        return {"loss": float(loss.detach()), "grad_norm": grad_norm, **stats}

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        self.train_engine.save(Path(directory), self.rank)


class CostCriticWorker(CriticWorker):
    """Safe-RLHF's cost critic (its initial weights: `cost.critic_path`, else the cost model)."""

    values_key, returns_key, prefix = col.COST_VALUES, col.COST_RETURNS, "cost_critic"
