"""Bucketed weight sync: every parameter arrives bit for bit, in order, in bounded buckets; under
ZeRO-3 only the bucket in hand is gathered. Two ranks run on CPU (gloo) with DeepSpeed."""

import json

import pytest
import torch
from safetensors.torch import load_file

from hflow.engine.rollout.weight_sync import SyncStats, plan_buckets, weight_buckets


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
    import torch.multiprocessing as mp

    import weight_sync_ranks
    from hflow.engine.groups.dist import free_port

    mp.start_processes(weight_sync_ranks.run, nprocs=2, start_method="spawn", join=True,
                       args=(2, free_port(), stage, str(tiny_model), str(tmp_path), bucket_bytes))
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
