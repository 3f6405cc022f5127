"""A safetensors file written one tensor at a time, so a checkpoint never holds its tensors at once.

`safetensors.torch.save_file` takes a dict of every tensor: saving a model that way keeps the
whole fp32 state (weights, or both Adam moments) in host memory first, about 16 bytes per
parameter for the optimizer file: 112 GB at 7B. A checkpoint's names, shapes and dtypes are
known before any tensor is gathered, so the header can be written first and each tensor's
bytes appended as it arrives (`TensorFileWriter`); the reader (`safetensors.safe_open`) already
loads one tensor at a time.

The format (https://huggingface.co/docs/safetensors, "Format"): 8 bytes, a little-endian u64 N;
N bytes of JSON mapping each name to its dtype, shape and `data_offsets` [begin, end) into the
data that follows, padded with spaces to a multiple of 8; then the tensors' bytes, in offset
order, with no gaps (the reader checks that).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import torch

DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


class TensorSpec(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * torch.empty((), dtype=self.dtype).element_size()


def header_bytes(specs: list[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length and the JSON header of a file holding `specs`' tensors in that order."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for spec in specs:
        if spec.name in header:
            raise ValueError(f"tensor name {spec.name!r} appears twice")
        header[spec.name] = {"dtype": DTYPE_NAMES[spec.dtype], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


class TensorFileWriter:
    """Writes `specs`' tensors to `path` in the order given; `write` takes each one in turn.

    Used as a context manager: the file is complete only when every tensor was written (else
    `close` raises, and a partial file is left for the caller's checkpoint staging to discard)."""

    def __init__(self, path: Path, specs: list[TensorSpec]):
        self.path, self.specs, self.next = Path(path), specs, 0
        self.file = open(self.path, "wb")
        self.file.write(header_bytes(specs))

    def write(self, name: str, tensor: torch.Tensor) -> None:
        spec = self.specs[self.next]
        if name != spec.name or tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
            raise ValueError(f"{self.path.name}: expected {spec.name} {spec.shape} {spec.dtype}, "
                             f"got {name} {tuple(tensor.shape)} {tensor.dtype}")
        data = tensor.detach().to("cpu").contiguous()
        # A view of the tensor's bytes (no copy); safetensors stores little-endian, as x86/ARM are.
        self.file.write(memoryview(data.view(torch.uint8).reshape(-1).numpy()))
        self.next += 1

    def close(self) -> None:
        try:
            if self.next != len(self.specs):
                raise ValueError(f"{self.path.name}: {len(self.specs) - self.next} of {len(self.specs)} "
                                 "tensors were not written")
            self.file.flush()
            os.fsync(self.file.fileno())
        finally:
            self.file.close()

    def __enter__(self) -> "TensorFileWriter":
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.close()
        else:
            self.file.close()
