"""Bucketed weight sync: every parameter arrives bit for bit, in order, in bounded buckets; under
ZeRO-3 only the bucket in hand is gathered. Two ranks run on CPU (gloo) with DeepSpeed."""

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file

from hflow.engine.rollout import weight_sync
from hflow.engine.rollout.weight_sync import HostStaging, PackedBucket, SyncStats, plan_buckets, weight_buckets


def test_plan_buckets_bounds_and_keeps_order():
    sizes = [4, 4, 10, 1, 1, 3, 30, 2]
    buckets = plan_buckets(sizes, bucket_bytes=8)
    assert [i for b in buckets for i in b] == list(range(len(sizes)))
    for bucket in buckets:
        assert len(bucket) == 1 or sum(sizes[i] for i in bucket) <= 8  # an oversized tensor goes alone
    assert buckets == [[0, 1], [2], [3, 4, 5], [6], [7]]


def test_weight_buckets_single_process_are_exact(tiny_model):
    from hflow.engine.models.loading import load_causal_lm

    model = load_causal_lm(str(tiny_model), torch.float32)
    received: dict[str, torch.Tensor] = {}
    sizes = []

    def consumer(pairs):
        sizes.append(sum(t.numel() * t.element_size() for _, t in pairs))
        received.update({n: t.clone() for n, t in pairs})

    bucket = 4096
    stats = SyncStats()
    for pairs in weight_buckets(model, bucket, torch.bfloat16, stats=stats):
        consumer(pairs)
    names = [n for n, _ in model.named_parameters()]
    assert list(received) == names
    largest = max(p.numel() for p in model.parameters()) * 2
    assert max(sizes) <= max(bucket, largest) and stats.buckets == len(sizes) > 1
    for name, param in model.named_parameters():
        assert received[name].dtype == torch.bfloat16
        assert torch.equal(received[name], param.detach().to(torch.bfloat16))


def _run_two_ranks(tiny_model, tmp_path, stage: int, bucket_bytes: int) -> list[dict]:
    import ranks
    import weight_sync_ranks
    from hflow.engine.groups.dist import free_port

    ranks.spawn(weight_sync_ranks.run, 2, tmp_path, free_port(), stage, str(tiny_model), str(tmp_path), bucket_bytes)
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_receive_the_trained_weights_bitwise(tiny_model, tmp_path, stage):
    bucket_bytes = 16 << 10
    results = _run_two_ranks(tiny_model, tmp_path, stage, bucket_bytes)
    initial = load_file(tiny_model / "model.safetensors")
    references = [torch.load(tmp_path / f"reference-{r}.pt") for r in range(2)]
    assert any(not torch.equal(references[0][n], initial[n]) for n in references[0] if n in initial), \
        "the optimizer step changed nothing"
    for rank, result in enumerate(results):
        reference = references[rank]
        assert list(reference) == result["order"]
        for dtype in ("float32", "bfloat16"):
            streamed = torch.load(tmp_path / f"streamed-{rank}-{dtype}.pt")
            buckets = result[f"torch.{dtype}"]["buckets"]
            assert [n for b in buckets for n in b["names"]] == result["order"]  # fixed order, each once
            for b in buckets:
                assert b["dtypes"] == [f"torch.{dtype}"]
                assert len(b["names"]) == 1 or b["bytes"] <= bucket_bytes
                if stage == 3:
                    assert b["gathered"] == sorted(b["names"])  # never more than the bucket in hand
            for name, tensor in reference.items():
                assert torch.equal(streamed[name], tensor.to(getattr(torch, dtype))), (rank, dtype, name)
        if stage == 3:
            assert result["partitioned_outside"]  # released again after each bucket
    # Both ranks hold the same (data-parallel) weights.
    for name in references[0]:
        assert torch.equal(references[0][name], references[1][name])


# --- PackedBucket: the async weight stream's unit, pinned staging from a GPU ---------------------


def _bucket(dtype=torch.bfloat16, scale=1.0):
    g = torch.Generator().manual_seed(0)
    return [("a.weight", (torch.randn(3, 4, generator=g) * scale).to(dtype)),
            ("a.bias", torch.randn(4, generator=g).to(dtype)),
            ("b.weight", torch.randn(2, 3, 5, generator=g).to(dtype))]


def _sent(packed: PackedBucket, out_of_band: bool = True) -> tuple[PackedBucket, int]:
    """`packed` through pickle 5 as Ray sends it, and the bytes it carried: out-of-band buffers
    copied into the object store and handed back read-only (as `bytes` here)."""
    buffers = []
    data = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append if out_of_band else None)
    stored = [bytes(b.raw()) for b in buffers]
    return pickle.loads(data, buffers=stored), len(data) + sum(len(b) for b in stored)


def _assert_exact(received, bucket):
    assert [n for n, _ in received] == [n for n, _ in bucket]
    for (_, got), (_, want) in zip(received, bucket):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want.cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_cpu_bucket_round_trips_exactly_without_pinned_memory(monkeypatch, dtype):
    monkeypatch.setattr(weight_sync, "_pinned_bytes", lambda nbytes: pytest.fail("pinned memory for a CPU bucket"))
    bucket = _bucket(dtype)
    packed = PackedBucket.pack(bucket)
    _assert_exact(packed.unpack(), bucket)
    for out_of_band in (True, False):
        back, carried = _sent(packed, out_of_band)
        _assert_exact(back.unpack(), bucket)
        back.flat.zero_()  # the receiver's own memory, not the store's read-only bytes
        assert carried < packed.flat.numel() * packed.flat.element_size() + 1024  # the bytes, once
    assert PackedBucket.pack([]).unpack() == []
    assert _sent(PackedBucket.pack([]))[0].unpack() == []


def test_a_gpu_bucket_goes_through_one_reused_staging_buffer(monkeypatch):
    """The pinned path, with CUDA stood in for: chosen for GPU tensors only, the buffer reused for
    every bucket and grown for a larger one, the copies synchronised before the bucket is handed
    on, and a bucket pickled as its own bytes only (not the whole buffer)."""
    allocated, synced = [], []
    monkeypatch.setattr(weight_sync, "_on_gpu", lambda bucket: bool(bucket))
    monkeypatch.setattr(weight_sync, "_pinned_bytes", lambda n: allocated.append(n) or torch.empty(n, dtype=torch.uint8))
    monkeypatch.setattr(weight_sync, "_synchronize", synced.append)
    staging = HostStaging()
    big, small = _bucket(scale=2.0), _bucket()[:2]
    first = PackedBucket.pack(big, staging)
    assert allocated == [sum(t.numel() for _, t in big) * 2] and synced == [torch.device("cpu")]
    _assert_exact(first.unpack(), big)
    sent_first, carried = _sent(first)
    second = PackedBucket.pack(small, staging)  # reuses the buffer: `first` is overwritten, as documented
    assert len(allocated) == 1 and second.flat.data_ptr() == first.flat.data_ptr() == staging.buffer.data_ptr()
    _assert_exact(second.unpack(), small)
    _assert_exact(sent_first.unpack(), big)  # what was sent before is a copy, untouched
    sent_second, carried_second = _sent(second)
    _assert_exact(sent_second.unpack(), small)
    assert carried_second < carried  # only the small bucket's bytes, not the buffer's
    larger = [(f"t{i}", torch.randn(64)) for i in range(3)]  # float32 too: any dtype
    third = PackedBucket.pack(larger, staging)
    assert allocated[-1] == 3 * 64 * 4 and len(allocated) == 2
    _assert_exact(_sent(third)[0].unpack(), larger)


def test_the_pinned_path_is_for_cuda_tensors_only():
    assert not weight_sync._on_gpu([])
    assert not weight_sync._on_gpu(_bucket())


@pytest.mark.gpu
def test_a_cuda_bucket_is_staged_in_pinned_memory_and_arrives_exactly():
    device = torch.device("cuda", torch.cuda.current_device())
    bucket = [(n, t.to(device)) for n, t in _bucket()]
    staging = HostStaging()
    packed = PackedBucket.pack(bucket, staging)
    assert packed.flat.is_pinned() and packed.flat.device.type == "cpu"
    sent, _ = _sent(packed)
    _assert_exact(sent.unpack(), bucket)
    again = PackedBucket.pack([(n, t * 2) for n, t in bucket], staging)
    assert again.flat.data_ptr() == packed.flat.data_ptr()  # the same pinned buffer
    _assert_exact(_sent(again)[0].unpack(), [(n, t * 2) for n, t in bucket])
    _assert_exact(sent.unpack(), bucket)
    # Into a GPU copy of the weights, as the rollout worker's generator copy loads it.
    params = {n: torch.zeros_like(t) for n, t in bucket}
    for name, tensor in sent.unpack():
        params[name].copy_(tensor)
    for name, tensor in bucket:
        assert torch.equal(params[name], tensor)
