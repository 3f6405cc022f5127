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
training state back. Under ZeRO-3 the `hf` engine works the same way with whole weights gathered
for the rollout (`gathered_generator.py`).

Memory at the hand-over, where first GPU runs of hybrid engines run out of it (vLLM sizes its
KV cache when the GPU is empty and maps exactly that back on wake-up):
- the training state leaves, and the allocator's cache is emptied, before the generator's
  weights wake; the cache is emptied again before its KV cache wakes (the weight buckets' blocks);
- a third phase, `scoring`, lets the reference, reward and critic run on the same devices with
  the generator asleep and the training state still off (`to_scoring`, called by the controller
  once a step's generation is over), so no other model ever runs beside a woken generator;
- `measure` states the budget of each phase (`hflow bench switch`).
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
    `load_weights(buckets)` on the way to rollout and gives its memory back in `release()`.

    `train_engine` None: `module` does not train (an evaluation, `ActorWorker.init_generation`):
    there is no training state to move, and the module stays in eval mode."""

    def __init__(self, train_engine, device: torch.device, rollout_engine=None, bucket_bytes: int = 512 << 20,
                 dtype: torch.dtype | None = None, offload: bool = False, module: torch.nn.Module | None = None,
                 zero3: bool = False):
        self.train_engine = train_engine
        self.module = train_engine.module if train_engine is not None else module
        self.zero3 = zero3  # the module's parameters are ZeRO-3 partitions: gathered bucket by bucket to sync
        self.device = device
        self.phase = "train"
        self.rollout_engine = rollout_engine
        self.bucket_bytes = bucket_bytes
        self.dtype = dtype
        self.last_sync: SyncStats | None = None
        self.offloaded: list[str] = []
        # The training state leaves during rollout.
        self.offload = (offload or rollout_engine is not None) and train_engine is not None

    def _memory(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return resident_bytes()

    def _empty_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def to_rollout(self) -> float:
        if self.phase == "rollout":
            return 0.0
        start = time.perf_counter()
        module = self.module
        for p in module.parameters():
            p.grad = None  # ZeRO keeps its own gradient partitions; these are stale views
        module.eval()
        if self.offload and self.phase == "train":
            self.offloaded = self.train_engine.offload_states()  # before vLLM or the KV cache claims it
        if self.rollout_engine is not None:
            self._empty_cache()  # what the training state and its activations left cached
            self.last_sync = self._sync_weights()
        self._empty_cache()
        self.phase = "rollout"
        return time.perf_counter() - start

    def _sync_weights(self) -> SyncStats:
        """The training weights into the rollout engine, bucket by bucket (`weight_sync.py`)."""
        module = self.module
        dtype = self.dtype or next(module.parameters()).dtype
        stats = SyncStats()
        self.rollout_engine.load_weights(weight_buckets(module, self.bucket_bytes, dtype, self.zero3, stats))
        return stats

    def to_scoring(self) -> float:
        """Rollout is over but training has not begun: the generator gives its memory back (vLLM
        sleeps, the gathered weights are freed) while the training state stays off the device, so
        colocated models score the step in the room both leave. From training, a no-op."""
        if self.phase != "rollout":
            return 0.0
        start = time.perf_counter()
        if self.rollout_engine is not None:
            self.rollout_engine.release()
        self._empty_cache()
        self.phase = "scoring"
        return time.perf_counter() - start

    def to_train(self) -> float:
        if self.phase == "train":
            return 0.0
        start = time.perf_counter()
        self.to_scoring()
        if self.offload:
            self.train_engine.reload_states()
            self.offloaded = []
        if self.train_engine is not None:
            self.module.train()
        self._empty_cache()
        self.phase = "train"
        return time.perf_counter() - start

    def training_state_bytes(self) -> int:
        """Weights (this rank's share), gradients and optimizer states held for training."""
        if self.train_engine is None:
            return 0
        module = self.module
        params = [getattr(p, "ds_tensor", p) for p in module.parameters()]
        optimizer = getattr(self.train_engine.optimizer, "optimizer", self.train_engine.optimizer)
        states = [v for state in optimizer.state.values() for v in state.values()]
        masters = getattr(self.train_engine.optimizer, "single_partition_of_fp32_groups", None) or \
            getattr(self.train_engine.optimizer, "fp32_partitioned_groups_flat", None) or []
        return tensor_bytes(params) + tensor_bytes(states) + tensor_bytes(masters)

    def generator_bytes(self) -> int:
        """The rollout engine's weights held now (vLLM's are its own business: 0 here)."""
        params = getattr(self.rollout_engine, "params", None) or {}
        return tensor_bytes(params.values())

    def measure(self) -> dict[str, float]:
        """One train -> rollout -> scoring -> train round trip: the switch times, and the memory of
        each phase (device memory allocated on a GPU, resident memory on a CPU) with what this
        engine accounts for in it: the training state (on the device unless offloaded) and the
        generator's weights."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        state = self.training_state_bytes()
        budget = {"train": {"memory_bytes": self._memory(), "training_state_bytes": state}}
        to_rollout = self.to_rollout()
        budget["rollout"] = {"memory_bytes": self._memory(), "generator_weights_bytes": self.generator_bytes(),
                             "offloaded": list(self.offloaded)}
        to_scoring = self.to_scoring()
        budget["scoring"] = {"memory_bytes": self._memory(), "generator_weights_bytes": self.generator_bytes(),
                             "offloaded": list(self.offloaded)}
        to_train = self.to_train()
        budget["train_again"] = {"memory_bytes": self._memory()}
        peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else max(
            phase["memory_bytes"] for phase in budget.values())
        return {"to_rollout_s": to_rollout, "to_scoring_s": to_scoring, "to_train_s": to_train,
                "memory_before_bytes": budget["train"]["memory_bytes"],
                "memory_in_rollout_bytes": budget["rollout"]["memory_bytes"],
                "memory_after_bytes": budget["train_again"]["memory_bytes"], "peak_bytes": peak,
                "training_state_bytes": state, "phases": budget}
