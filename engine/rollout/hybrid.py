"""The actor's hybrid engine: one set of weights, two phases (HybridFlow Section 5).

With the `hf` engine, training (DeepSpeed ZeRO) and rollout share the module, so switching
phase moves no weights: entering rollout drops the gradients and puts the module in eval
mode; entering training puts it back. On a GPU both switches also return the allocator's
cached blocks (the KV cache after rollout, activation buffers after training), so the other
phase can use that memory. Under ZeRO-3 the parameters stay sharded in both phases and each
layer is gathered only while a forward pass runs through it.
With `actor.offload_in_rollout` on a GPU, the optimizer's training state also leaves the GPU
while generating (`TrainEngine.offload_states`), making room for a larger KV cache.

With the `vllm` engine (`rollout_engine` below) vLLM holds its own copy of the weights, in its
own layout, only while generating. Entering rollout first moves the optimizer's training
state off the GPU (`TrainEngine.offload_states`: what DeepSpeed can offload for the stage),
then wakes vLLM and streams the current weights into it in buckets (`weight_sync.py`);
entering training puts vLLM to sleep (its weights and KV cache are freed) and brings the
training state back.
"""

from __future__ import annotations

import time

import torch

from hflow.engine.rollout.weight_sync import SyncStats, weight_buckets


def resident_bytes() -> int:
    """This process's resident memory now (CPU), from /proc."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except OSError:  # pragma: no cover - not Linux
        return 0
    import resource

    return pages * resource.getpagesize()


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class PhaseSwitch:
    """`rollout_engine`, when given, keeps its own weights (`VLLMGenerator`): it gets them through
    `load_weights(buckets)` on the way to rollout and gives its memory back in `release()`."""

    def __init__(self, train_engine, device: torch.device, rollout_engine=None, bucket_bytes: int = 512 << 20,
                 dtype: torch.dtype | None = None, offload: bool = False):
        self.train_engine = train_engine
        self.device = device
        self.phase = "train"
        self.rollout_engine = rollout_engine
        self.bucket_bytes = bucket_bytes
        self.dtype = dtype
        self.last_sync: SyncStats | None = None
        self.offloaded: list[str] = []
        self.offload = offload or rollout_engine is not None  # the training state leaves during rollout

    def _memory(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return resident_bytes()

    def to_rollout(self) -> float:
        if self.phase == "rollout":
            return 0.0
        start = time.perf_counter()
        module = self.train_engine.module
        for p in module.parameters():
            p.grad = None  # ZeRO keeps its own gradient partitions; these are stale views
        module.eval()
        if self.offload:
            self.offloaded = self.train_engine.offload_states()  # before vLLM or the KV cache claims it
        if self.rollout_engine is not None:
            self.last_sync = self._sync_weights()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.phase = "rollout"
        return time.perf_counter() - start

    def _sync_weights(self) -> SyncStats:
        """The training weights into the rollout engine, bucket by bucket (`weight_sync.py`)."""
        module = self.train_engine.module
        dtype = self.dtype or next(module.parameters()).dtype
        zero3 = self.train_engine.cfg.zero_stage == 3
        stats = SyncStats()
        self.rollout_engine.load_weights(weight_buckets(module, self.bucket_bytes, dtype, zero3, stats))
        return stats

    def to_train(self) -> float:
        if self.phase == "train":
            return 0.0
        start = time.perf_counter()
        if self.rollout_engine is not None:
            self.rollout_engine.release()
        if self.offload:
            self.train_engine.reload_states()
            self.offloaded = []
        self.train_engine.module.train()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.phase = "train"
        return time.perf_counter() - start

    def training_state_bytes(self) -> int:
        """Weights (this rank's share), gradients and optimizer states held for training."""
        module = self.train_engine.module
        params = [getattr(p, "ds_tensor", p) for p in module.parameters()]
        optimizer = getattr(self.train_engine.optimizer, "optimizer", self.train_engine.optimizer)
        states = [v for state in optimizer.state.values() for v in state.values()]
        masters = getattr(self.train_engine.optimizer, "single_partition_of_fp32_groups", None) or \
            getattr(self.train_engine.optimizer, "fp32_partitioned_groups_flat", None) or []
        return tensor_bytes(params) + tensor_bytes(states) + tensor_bytes(masters)

    def measure(self) -> dict[str, float]:
        """One train -> rollout -> train round trip: times and memory around it."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        before = self._memory()
        to_rollout = self.to_rollout()
        during = self._memory()
        to_train = self.to_train()
        after = self._memory()
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else max(
            before, during, after)
        return {"to_rollout_s": to_rollout, "to_train_s": to_train, "memory_before_bytes": before,
                "memory_in_rollout_bytes": during, "memory_after_bytes": after, "peak_bytes": peak,
                "training_state_bytes": self.training_state_bytes()}
