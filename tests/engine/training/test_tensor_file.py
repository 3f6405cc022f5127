"""The streaming safetensors writer: what it writes is what safetensors itself reads back."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from hflow.engine.training.tensor_file import TensorFileWriter, TensorSpec, header_bytes


def test_written_file_reads_back_exactly(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b.c": torch.randn(7).to(torch.bfloat16), "d": torch.arange(4)}
    specs = [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
    with TensorFileWriter(tmp_path / "x.safetensors", specs) as writer:
        for name, t in tensors.items():
            writer.write(name, t)
    back = load_file(tmp_path / "x.safetensors")
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t)
    with safe_open(tmp_path / "x.safetensors", "pt") as f:  # read lazily, one tensor at a time
        assert torch.equal(f.get_tensor("b.c"), tensors["b.c"])


def test_header_is_padded_to_eight_bytes_and_offsets_are_contiguous():
    raw = header_bytes([TensorSpec("w", (2, 3)), TensorSpec("v", (5,), torch.bfloat16)])
    length = int.from_bytes(raw[:8], "little")
    assert length % 8 == 0 and len(raw) == 8 + length
    assert b'"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}' in raw
    assert b'"v":{"dtype":"BF16","shape":[5],"data_offsets":[24,34]}' in raw


def test_out_of_order_or_missing_tensors_are_refused(tmp_path):
    specs = [TensorSpec("a", (2,)), TensorSpec("b", (2,))]
    writer = TensorFileWriter(tmp_path / "y.safetensors", specs)
    with pytest.raises(ValueError, match="expected a"):
        writer.write("b", torch.zeros(2))
    writer.write("a", torch.zeros(2))
    with pytest.raises(ValueError, match="1 of 2 tensors were not written"):
        writer.close()
