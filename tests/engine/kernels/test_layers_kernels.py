"""A layer's element-wise kernels (engine/kernels/layers.c) against the torch operators they
replace (in `fast_decode.py`'s step and `fused_layers.py`'s passes): the residual sum and RMSNorm
and its backward, the rotary pass over the joined q/k/v rows, SwiGLU's silu and product and its
backward; on the widths of the models met (and odd ones), on batches above and below the size
where threads are used, and on inputs far out in the silu's tails; a layout they cannot read is
refused before any pointer is handed over."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from hflow.engine.kernels import layers
from hflow.engine.rollout.fast_decode import rotate_half

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler: the kernels cannot be built here")

SHAPES = [(64, 256), (32, 576), (3, 70), (300, 512)]  # the last above the threads' threshold


@pytest.fixture(scope="module")
def kernels():
    found = layers.available()
    assert found is not None, "the kernels were not built on a machine with a C compiler (see the log)"
    return found


@pytest.mark.parametrize("rows,width", SHAPES)
@pytest.mark.parametrize("with_delta", [True, False])
def test_residual_sum_and_rms_norm(kernels, rows, width, with_delta):
    g = torch.Generator().manual_seed(rows)
    h, delta = torch.randn(rows, width, generator=g) * 3, torch.randn(rows, width, generator=g)
    weight = torch.randn(width, generator=g)
    summed = h + delta if with_delta else h.clone()
    out = kernels.add_rms_norm(h, delta if with_delta else None, weight, 1e-5)
    assert torch.equal(h, summed)  # the residual stream updated in place, exactly
    torch.testing.assert_close(out, F.rms_norm(summed, (width,), weight, 1e-5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows,heads,kv_heads,head_dim", [(64, 8, 8, 32), (32, 9, 3, 64), (5, 2, 1, 6),
                                                          (300, 8, 8, 64)])
def test_rotary_in_place_on_the_joined_rows(kernels, rows, heads, kv_heads, head_dim):
    """The query and key heads rotated at each row's own position, the value heads untouched."""
    g = torch.Generator().manual_seed(head_dim)
    capacity = 40
    angles = torch.rand(capacity, head_dim // 2, generator=g) * 6
    cos, sin = torch.cat((angles.cos(),) * 2, -1), torch.cat((angles.sin(),) * 2, -1)
    signed_sin = torch.cat((-sin[:, :head_dim // 2], sin[:, head_dim // 2:]), -1)
    positions = torch.randint(0, capacity, (rows,), generator=g)
    joined = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, generator=g)
    qk = joined[:, :(heads + kv_heads) * head_dim].view(rows, heads + kv_heads, head_dim)
    c, s = cos[positions][:, None], sin[positions][:, None]
    want = torch.cat(((qk * c + rotate_half(qk) * s).reshape(rows, -1), joined[:, qk[0].numel():]), -1)
    got = joined.clone()
    assert kernels.rotary_(got, heads + kv_heads, head_dim, cos, signed_sin, positions) is got
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[:, qk[0].numel():], joined[:, qk[0].numel():])


@pytest.mark.parametrize("rows,inter", [(64, 768), (32, 1536), (3, 37), (300, 1536)])
def test_silu_times_up(kernels, rows, inter):
    g = torch.Generator().manual_seed(inter)
    gate_up = torch.randn(rows, 2 * inter, generator=g) * 4
    gate_up[0, :6] = torch.tensor([0.0, -0.0, 90.0, -90.0, 1e4, -1e4])  # the tails: no overflow, no NaN
    want = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    torch.testing.assert_close(kernels.silu_mul(gate_up), want, rtol=1e-5, atol=1e-6)


def test_layouts_the_kernels_cannot_read_are_refused(kernels):
    h = torch.randn(8, 16)
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.add_rms_norm(h.t(), None, torch.ones(8), 1e-5)  # transposed: strided rows
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.add_rms_norm(h.double(), None, torch.ones(16, dtype=torch.float64), 1e-5)
    with pytest.raises(ValueError, match="shape"):
        kernels.add_rms_norm(h, torch.randn(8, 15), torch.ones(16), 1e-5)
    with pytest.raises(ValueError, match="even width"):
        kernels.silu_mul(torch.randn(4, 9))
    table = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="positions"):
        kernels.rotary_(torch.randn(2, 16), 2, 8, table, table, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="rows"):
        kernels.rotary_(torch.randn(2, 16), 3, 8, table, table, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="outside its table's 4 rows"):
        kernels.rotary_(torch.randn(2, 16), 2, 8, table, table, torch.tensor([1, 4]))


@pytest.mark.parametrize("rows,width", SHAPES)
def test_rms_norm_backward_is_autograd_s(kernels, rows, width):
    g = torch.Generator().manual_seed(width)
    x = (torch.randn(rows, width, generator=g) * 2).requires_grad_()
    weight = torch.randn(width, generator=g).requires_grad_()
    grad = torch.randn(rows, width, generator=g)
    F.rms_norm(x, (width,), weight, 1e-5).backward(grad)
    rstd = torch.empty(rows)
    kernels.add_rms_norm(x.detach().clone(), None, weight.detach(), 1e-5, rstd)
    torch.testing.assert_close(rstd, torch.rsqrt(x.detach().pow(2).mean(-1) + 1e-5), rtol=1e-6, atol=0)
    dx, dweight = kernels.rms_norm_backward(grad, x.detach(), weight.detach(), rstd)
    torch.testing.assert_close(dx, x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dweight, weight.grad, rtol=1e-5, atol=1e-4)  # a sum over the rows


@pytest.mark.parametrize("shape", [(1, 300, 1536), (5, 37), (2, 3, 16)])
def test_silu_times_and_its_backward_are_autograd_s(kernels, shape):
    g = torch.Generator().manual_seed(len(shape))
    gate = (torch.randn(shape, generator=g) * 4).requires_grad_()
    up = torch.randn(shape, generator=g).requires_grad_()
    grad = torch.randn(shape, generator=g)
    out = F.silu(gate) * up
    out.backward(grad)
    torch.testing.assert_close(kernels.silu_times(gate.detach(), up.detach()), out.detach(), rtol=1e-5, atol=1e-6)
    dgate, dup = kernels.silu_times_backward(grad, gate.detach(), up.detach())
    torch.testing.assert_close(dgate, gate.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dup, up.grad, rtol=1e-5, atol=1e-6)
