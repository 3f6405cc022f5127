"""`model.dtype` on each device: `auto` is bf16 only on a GPU with native bf16 (compute capability
8.0+), and an explicit bfloat16 on an older GPU stops in one line naming it."""

import re

import pytest
import torch

from hflow.engine.models.loading import gpu_has_bf16, resolve_dtype
from hflow.errors import UserError

CUDA = torch.device("cuda:1")


def _gpu(monkeypatch, capability: tuple[int, int], name: str) -> list:
    """A GPU with `capability` and `name`, on any device asked about (the devices asked are returned)."""
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    return asked


@pytest.mark.parametrize("capability, name, auto", [
    ((7, 0), "Tesla V100-SXM2-32GB", torch.float32),
    ((7, 5), "Tesla T4", torch.float32),
    ((8, 0), "NVIDIA A100-SXM4-80GB", torch.bfloat16),
    ((8, 9), "NVIDIA L40S", torch.bfloat16),
    ((9, 0), "NVIDIA H100 80GB HBM3", torch.bfloat16),
])
def test_auto_is_bfloat16_only_where_the_gpu_has_it(monkeypatch, capability, name, auto):
    asked = _gpu(monkeypatch, capability, name)
    assert resolve_dtype("auto", CUDA) == auto
    assert asked == [CUDA]  # this rank's GPU, not the current device
    assert resolve_dtype("float32", CUDA) == torch.float32
    assert gpu_has_bf16(CUDA) == (auto == torch.bfloat16)


def test_explicit_bfloat16_on_a_gpu_without_it_names_the_gpu(monkeypatch):
    _gpu(monkeypatch, (7, 5), "Tesla T4")
    with pytest.raises(UserError) as err:
        resolve_dtype("bfloat16", CUDA)
    line = str(err.value)
    assert "\n" not in line
    for needle in ("model.dtype is bfloat16", "Tesla T4", "compute capability 7.5", "8.0", "model.dtype: float32"):
        assert needle in line, line
    _gpu(monkeypatch, (8, 0), "NVIDIA A100-SXM4-80GB")
    assert resolve_dtype("bfloat16", CUDA) == torch.bfloat16


def test_the_cpu_is_unchanged(monkeypatch):
    """float32 for auto; an explicit bfloat16 runs (DeepSpeed's CPU bf16; tests/e2e/test_bf16_cpu.py)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: pytest.fail("asked a GPU"))
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("float32", cpu) == torch.float32


@pytest.mark.gpu
def test_this_gpu_agrees_with_its_compute_capability():
    device = torch.device("cuda:0")
    native = torch.cuda.get_device_capability(device) >= (8, 0)
    assert resolve_dtype("auto", device) == (torch.bfloat16 if native else torch.float32)
    if not native:
        with pytest.raises(UserError, match=re.escape(torch.cuda.get_device_name(device))):
            resolve_dtype("bfloat16", device)
