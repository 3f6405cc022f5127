"""Weight sync of the hybrid engine: the actor's training parameters, streamed in buckets.

The training engine (DeepSpeed ZeRO) owns the weights; a separate generation engine (vLLM)
needs a copy of them in its own layout after every update. `weight_buckets` hands them over
bucket by bucket, so the extra memory at any moment is one bucket, never a second state dict:

- buckets hold whole tensors, at most `bucket_bytes` each (counted in the generation dtype);
  a tensor larger than that goes alone;
- names are Hugging Face parameter names (`model.layers.0.self_attn.q_proj.weight`), in
  `named_parameters()` order, which is the same on every rank; a module with LoRA adapters
  sends its merged weights under the base model's names (`lora.merged_weights`);
- under ZeRO-3 each bucket's parameters are gathered with
  `deepspeed.zero.GatheredParameters` (a collective: every rank enters with the same bucket
  in the same order) and partitioned again as soon as the consumer returns;
- each tensor is cast to the generation dtype inside its bucket.

The consumer gets a list of (name, tensor). The tensors are only valid during the call (they
can be the live training parameters or gathered buffers that are freed right after): it must
copy what it keeps and must not modify them.

Parallel layouts (HybridFlow, Sheng et al. 2025, arXiv 2409.19256, Section 5). The paper
trains with Megatron 3D parallelism (pipeline p, tensor t, data d) and generates with a
smaller model-parallel size (pg, tg). It splits each training model-parallel group into
micro data-parallel groups of size (p*t)/(pg*tg), arranged so that every rank's training
shard is a part of its generation shard: switching phase is an all-gather inside the micro-DP
group only, and no rank ever holds weights it does not use (zero redundancy). hflow trains with
ZeRO data parallelism instead (p = t = 1: a rank's shard is a flat slice of every tensor, not
a tensor-parallel slice), so no grouping can make training shards line up with vLLM's
tensor-parallel shards. What hflow does: every rank rebuilds whole tensors one bucket at a
time (ZeRO-0/1/2: its own full bf16/fp32 copy; ZeRO-3: an all-gather over the actor group)
and vLLM's weight loaders keep the rank's tensor-parallel slice of each. The price is one
transient full bucket per rank, bounded by `rollout.weight_bucket_mb`; what stays resident is
vLLM's own shard.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from hflow.engine.models.lora import merged_weights


@dataclass
class SyncStats:
    buckets: int = 0
    tensors: int = 0
    bytes: int = 0
    largest_bucket_bytes: int = 0
    seconds: float = 0.0


def full_numel(param: torch.nn.Parameter) -> int:
    """Elements of the whole tensor (a ZeRO-3 partitioned parameter is empty until gathered)."""
    return int(getattr(param, "ds_numel", param.numel()))


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive index groups whose sizes sum to at most `bucket_bytes`; a larger item alone."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, size in enumerate(sizes):
        if current and filled + size > bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += size
    if current:
        buckets.append(current)
    return buckets


def bucket_count(module: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype) -> int:
    """How many buckets `weight_buckets` yields for `module` (nothing is gathered or cast)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return len(plan_buckets([full_numel(sources[0]) * itemsize for _, sources, _ in merged_weights(module)],
                            bucket_bytes))


def weight_buckets(module: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype, zero3: bool = False,
                   stats: SyncStats | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Every parameter of `module`, one bucket at a time (see the module docstring); `stats` is
    filled in as the buckets go. Under ZeRO-3 a bucket is gathered until the consumer asks for the
    next one, and every rank of the group must iterate together. A consumer may keep references
    to a bucket's tensors past that point (vLLM buffers a layer until all its parts arrived):
    they stay valid, since DeepSpeed re-partitions by swapping the parameter's data."""
    start = time.perf_counter()
    named = merged_weights(module)  # with LoRA: base + (alpha / r) B A per layer, under the base names
    itemsize = torch.empty((), dtype=dtype).element_size()
    sizes = [full_numel(sources[0]) * itemsize for _, sources, _ in named]
    stats = stats if stats is not None else SyncStats()
    for bucket in plan_buckets(sizes, bucket_bytes):
        params = [p for i in bucket for p in named[i][1]]
        with _gathered(params, zero3), torch.no_grad():
            yield [(named[i][0], named[i][2]().to(dtype)) for i in bucket]
        size = sum(sizes[i] for i in bucket)
        stats.buckets += 1
        stats.tensors += len(bucket)
        stats.bytes += size
        stats.largest_bucket_bytes = max(stats.largest_bucket_bytes, size)
        stats.seconds = time.perf_counter() - start


@dataclass
class PackedBucket:
    """A bucket for another process (the rollout role's workers, through Ray's object store): one
    flat host tensor and each tensor's name and shape. Pickling the tensors themselves would copy
    each one's whole storage, and a training parameter can be a view into a flat buffer of many
    (ZeRO's): measured, 1-2 s instead of milliseconds for a 14 MB model.

    From a GPU the bucket is packed into a page-locked (pinned) host buffer that this process
    reuses for every bucket (`HostStaging`): the copies run as DMA, not through the driver's own
    staging of pageable memory, and no bucket-sized host memory is allocated per bucket (CUDA C++
    Best Practices Guide, "Pinned Memory"). `flat` is then a view of that buffer, valid until the
    next `pack` in this process; sending the bucket (pickling it) copies it out. Pickling writes
    the bucket's bytes alone, as one buffer that Ray's pickle 5 copies straight into its object
    store (`__reduce__`); torch's own pickle would serialise the whole storage `flat` views (the
    reused buffer, up to the largest bucket). From the CPU, `pack` is the concatenation it always
    was."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    flat: torch.Tensor

    @classmethod
    def pack(cls, bucket: list[tuple[str, torch.Tensor]], staging: "HostStaging | None" = None) -> "PackedBucket":
        names, shapes = [name for name, _ in bucket], [tuple(t.shape) for _, t in bucket]
        if not _on_gpu(bucket):
            flat = torch.cat([t.detach().reshape(-1) for _, t in bucket]).cpu() if bucket else torch.empty(0)
            return cls(names, shapes, flat)
        staging = staging if staging is not None else _STAGING
        flat = staging.take(sum(t.numel() for _, t in bucket), bucket[0][1].dtype)
        offset = 0
        for _, tensor in bucket:
            flat[offset:offset + tensor.numel()].copy_(tensor.detach().reshape(-1), non_blocking=True)
            offset += tensor.numel()
        _synchronize(bucket[0][1].device)  # the copies are queued: the buffer is filled only after this
        return cls(names, shapes, flat)

    def unpack(self) -> list[tuple[str, torch.Tensor]]:
        sizes = [int(torch.Size(shape).numel()) for shape in self.shapes]
        return [(name, piece.view(shape))
                for name, shape, piece in zip(self.names, self.shapes, self.flat.split(sizes))]

    def __reduce__(self):
        data = self.flat.detach().contiguous().view(-1)
        return _unpickle_bucket, (self.names, self.shapes, str(data.dtype).removeprefix("torch."),
                                  data.view(torch.uint8).numpy())


def _unpickle_bucket(names: list[str], shapes: list, dtype: str, raw) -> PackedBucket:
    """A PackedBucket from `__reduce__`'s bytes. Ray hands them back zero-copy, read-only, from its
    object store; they are copied into this process's memory, as torch's own unpickling did, so
    that a receiver holding buckets (`vllm_copy.VLLMCopy` keeps a whole version) does not pin
    them in the object store."""
    if not raw.size:
        return PackedBucket(names, [tuple(s) for s in shapes], torch.empty(0, dtype=getattr(torch, dtype)))
    flat = torch.from_numpy(raw if raw.flags.writeable else raw.copy())
    return PackedBucket(names, [tuple(s) for s in shapes], flat.view(getattr(torch, dtype)))


class HostStaging:
    """A pinned host buffer, reused for every bucket packed from a GPU and grown to the largest
    (a bucket is at most `rollout.weight_bucket_mb`, or one tensor larger than that)."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat tensor of `numel` elements of `dtype`, at the start of the buffer."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = None  # release the smaller one first
            self.buffer = _pinned_bytes(nbytes)
        return self.buffer[:nbytes].view(dtype)


_STAGING = HostStaging()  # one per process: a process is one rank, packing one bucket at a time


def _on_gpu(bucket: list[tuple[str, torch.Tensor]]) -> bool:
    return bool(bucket) and all(tensor.is_cuda for _, tensor in bucket)


def _pinned_bytes(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _synchronize(device: torch.device) -> None:
    torch.cuda.current_stream(device).synchronize()


def _gathered(params: list[torch.nn.Parameter], zero3: bool):
    """Whole tensors for the duration of the block: a collective all-gather under ZeRO-3 (read-only:
    nothing is written back), nothing to do below it."""
    if not zero3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
