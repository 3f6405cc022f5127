"""The transpose kernel (engine/kernels/transpose.c) against torch's own copy: the same bits, on an
LM head's width, on shapes that are not whole tiles or blocks, on rows with a stride of their own,
above and below the size where threads are used; a layout it cannot read is refused; `in_rows`
leaves a tensor in rows as it is and falls back on torch where the kernel cannot be built."""

import shutil

import pytest
import torch

from hflow.engine.kernels import transpose

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                    reason="no C compiler: the kernel cannot be built here")


@pytest.fixture(scope="module")
def kernel():
    found = transpose.available()
    assert found is not None, "the kernel was not built on a machine with a C compiler (see the log)"
    return found


@needs_compiler
@pytest.mark.parametrize("rows,cols", [(300, 49152), (1397, 1536), (64, 64), (65, 129), (17, 16), (16, 17),
                                       (9, 7), (1, 40), (40, 1), (0, 5)])
def test_the_kernel_copies_the_transpose_bit_for_bit(kernel, rows, cols):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * 7 + cols))
    out = kernel(x)
    assert out.shape == (cols, rows) and out.is_contiguous()
    assert torch.equal(out, x.t())


@needs_compiler
def test_rows_with_a_stride_of_their_own_are_read_where_they_lie(kernel):
    base = torch.randn(70, 300)
    x = base[5:65, 17:250]  # rows 300 floats apart, 233 read
    assert x.stride() == (300, 1)
    assert torch.equal(kernel(x), x.t().contiguous())


@needs_compiler
@pytest.mark.parametrize("bad", [torch.randn(8, 8, dtype=torch.float64), torch.randn(8, 8).t(),
                                 torch.randn(2, 8, 8)])
def test_a_layout_it_cannot_read_is_refused(kernel, bad):
    with pytest.raises(ValueError, match="transpose kernel takes"):
        kernel(bad)


@needs_compiler
def test_in_rows_copies_a_transposed_view_by_the_kernel_and_leaves_rows_alone(kernel, monkeypatch):
    x = torch.randn(50, 3000)
    assert transpose.in_rows(x) is x
    calls = []
    monkeypatch.setattr(transpose.Transpose, "__call__",
                        lambda self, t: calls.append(t.shape) or t.t().contiguous())
    got = transpose.in_rows(x.t())
    assert calls == [(50, 3000)] and torch.equal(got, x.t())


def test_in_rows_falls_back_on_torch_where_there_is_no_kernel(monkeypatch):
    monkeypatch.setattr(transpose, "available", lambda: None)
    x = torch.randn(33, 70)
    got = transpose.in_rows(x.t())
    assert got.is_contiguous() and torch.equal(got, x.t())
    double = torch.randn(5, 6, dtype=torch.float64).t()  # not the kernel's dtype: torch's copy
    assert torch.equal(transpose.in_rows(double), double.contiguous())
