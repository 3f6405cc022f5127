"""The decoding step's products kernel (engine/kernels/thin_products.c) against torch's product: row
counts across its groups of rows and their remainders, output widths that leave a panel or a pair
of panels part-filled, a bias, rows cut from a wider tensor; each output summed by one thread."""

import shutil
from pathlib import Path

import pytest
import torch

from hflow.engine.kernels import thin_products

pytestmark = [
    pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                       reason="no C compiler: the kernel cannot be built here"),
    pytest.mark.skipif("avx512f" not in Path("/proc/cpuinfo").read_text(errors="replace")
                       if Path("/proc/cpuinfo").exists() else True,
                       reason="no AVX-512 here: the kernel is built for AVX-512 only"),
]


@pytest.fixture(scope="module")
def kernel():
    found = thin_products.available()
    assert found is not None, "the kernel was not built on an AVX-512 machine with a C compiler (see the log)"
    return found


def test_a_cpu_without_avx512_keeps_onednn_s_products(monkeypatch, tmp_path, caplog):
    """Built for a CPU without AVX-512, the kernel refuses to compile, and the step is told it has none."""
    from hflow.engine.kernels import build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(build, "FLAGS", [f for f in build.FLAGS if f != "-march=native"] + ["-march=x86-64-v3"])
    build.load.cache_clear()
    try:
        with caplog.at_level("INFO"):
            assert thin_products.available() is None
    finally:
        build.load.cache_clear()
    assert "AVX-512" in caplog.text


def _weight(out, inner, seed=0):
    return torch.randn(out, inner, generator=torch.Generator().manual_seed(seed)) / inner ** 0.5


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16, 17, 32])
@pytest.mark.parametrize("out, inner", [(32, 24), (37, 64), (50, 7), (960, 576), (16, 1536)])
def test_the_kernel_gives_torch_s_product(kernel, rows, out, inner):
    weight = _weight(out, inner)
    x = torch.randn(rows, inner, generator=torch.Generator().manual_seed(1))
    got = kernel(x, kernel.pack(weight))
    assert got.shape == (rows, out) and got.is_contiguous()
    torch.testing.assert_close(got, x @ weight.t(), rtol=1e-5, atol=1e-5)


def test_a_bias_is_added_to_every_row(kernel):
    weight, bias = _weight(45, 32), torch.randn(45)
    x = torch.randn(11, 32)
    torch.testing.assert_close(kernel(x, kernel.pack(weight), bias), x @ weight.t() + bias, rtol=1e-5, atol=1e-5)


def test_rows_and_a_weight_cut_from_wider_tensors(kernel):
    """x's rows and the weight's rows may lie further apart than their width (views of wider tensors)."""
    wide_x, wide_w = torch.randn(5, 40), _weight(30, 40)
    x, weight = wide_x[:, :24], wide_w[:, 8:32]
    torch.testing.assert_close(kernel(x, kernel.pack(weight)), x @ weight.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_result_does_not_depend_on_the_threads(kernel, threads):
    weight, x = _weight(200, 96), torch.randn(13, 96)
    panels = kernel.pack(weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(x, panels)
        torch.set_num_threads(threads)
        assert torch.equal(kernel(x, panels), one)  # each output column summed by one thread, in one order
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", ["dtype", "width", "columns", "bias"])
def test_inputs_the_kernel_would_misread_are_refused(kernel, bad):
    panels, x, bias = kernel.pack(_weight(20, 16)), torch.randn(4, 16), None
    if bad == "dtype":
        x = x.double()
    elif bad == "width":
        x = torch.randn(4, 17)
    elif bad == "columns":
        x = torch.randn(16, 4).t()
    else:
        bias = torch.randn(19)
    with pytest.raises(ValueError, match="thin products"):
        kernel(x, panels, bias)


def test_a_weight_it_cannot_read_is_refused(kernel):
    with pytest.raises(ValueError, match="thin products' weights"):
        kernel.pack(torch.randn(16, 8).t())
