import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, add_protocol


def make(n=6):
    return Batch({"x": torch.arange(n), "y": torch.arange(2 * n).view(n, 2)},
                 {"text": [f"t{i}" for i in range(n)]}, {"step": 3})


def test_chunk_concat_roundtrip_keeps_order():
    b = make()
    parts = b.chunk(3)
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    back = Batch.concat(parts)
    assert back["x"].tolist() == list(range(6)) and back["text"] == b["text"] and back.meta == {"step": 3}


def test_repeat_groups_rows_and_union():
    b = make(2).repeat(3)
    assert b["x"].tolist() == [0, 0, 0, 1, 1, 1] and b["text"] == ["t0"] * 3 + ["t1"] * 3
    u = b | Batch({"z": torch.ones(6)})
    assert set(u.keys()) == {"x", "y", "text", "z"}
    with pytest.raises(ValueError):
        b | Batch({"z": torch.ones(5)})


def test_mismatched_sizes_rejected():
    with pytest.raises(ValueError):
        Batch({"a": torch.ones(2)}, {"b": [1, 2, 3]})


def test_dp_compute_splits_and_gathers_in_rank_order():
    b = make(8)
    per_rank = Dispatch.DP_COMPUTE.split((b,), {"flag": True}, 4)
    assert [a[0]["x"].tolist() for a, _ in per_rank] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(kw == {"flag": True} for _, kw in per_rank)
    gathered = Dispatch.DP_COMPUTE.collect([a[0] for a, _ in per_rank])
    assert gathered["x"].tolist() == list(range(8))
    assert Dispatch.DP_COMPUTE.collect([{"m": 1.0}, {"m": 3.0}]) == {"m": 2.0}


def test_dp_compute_uneven_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="multiple of 4"):
        Dispatch.DP_COMPUTE.split((make(6),), {}, 4)


def test_one_to_all_rank_zero_and_new_protocol():
    assert Dispatch.ONE_TO_ALL.split((1,), {}, 3) == [((1,), {})] * 3
    assert Dispatch.RANK_ZERO.collect(["a", "b"]) == "a"
    proto = add_protocol("first_two", lambda a, k, w: [(a, k)] * w, lambda r: r[:2])
    assert Dispatch.FIRST_TWO is proto and proto.collect([1, 2, 3]) == [1, 2]


def test_dp_compute_splits_nested_batches_and_gathers_them_back():
    b = make(4)
    per_rank = Dispatch.DP_COMPUTE.split(({"rollout": b, "extra": [b, 7]},), {}, 2)
    first = per_rank[0][0][0]
    assert first["rollout"]["x"].tolist() == [0, 1] and first["extra"][0]["x"].tolist() == [0, 1]
    assert first["extra"][1] == 7
    results = [a[0] for a, _ in per_rank]
    gathered = Dispatch.DP_COMPUTE.collect([{"rollout": r["rollout"], "extra": r["extra"][0]} for r in results])
    assert gathered["rollout"]["x"].tolist() == [0, 1, 2, 3] and gathered["extra"]["text"] == b["text"]
