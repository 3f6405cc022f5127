"""The grids' attention kernel (engine/kernels/grid_attention.c) against torch's attention computed in
float64 (the slow reference): outputs and the gradients of queries, keys and values, for grouped
query heads, a row mask, a causal grid and none; head widths of one to eight vectors; more queries
than a block; rows laid out transposed as the packed grids hold them (and outputs in that layout);
a query that attends no key; and the calls it leaves to torch."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from hflow.engine.kernels import grid_attention

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler: the kernel cannot be built here")


@pytest.fixture(scope="module")
def kernel():
    found = grid_attention.available()
    assert found is not None, "the kernel was not built with a C compiler present (see the log)"
    return found


def _row_mask(batch: int, queries: int, keys: int, seed: int) -> torch.Tensor:
    """(batch, 1, queries, keys): each row's queries after `keys - queries` prompt keys, the first
    few of them left padding (masked), then causal among the queries."""
    g = torch.Generator().manual_seed(seed)
    before = keys - queries
    padding = torch.randint(0, max(before, 1), (batch,), generator=g)
    j, i = torch.arange(keys), torch.arange(queries)
    mask = (j[None, None] <= i[None, :, None] + before) & (j[None, None] >= padding[:, None, None])
    return mask[:, None]


def _compare(kernel, q, k, v, mask=None, causal=False, scale=None):
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    want_grads = torch.autograd.grad(want, leaves, grad.double())
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    got = grid_attention.attention(kernel, *inputs, mask, causal, scale)
    got_grads = torch.autograd.grad(got, inputs, grad)
    for a, b in zip((got, *got_grads), (want, *want_grads)):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-6 * max(1.0, float(b.detach().abs().max())))
    return got, got_grads


@pytest.mark.parametrize("rows, heads, kv_heads, queries, keys, width", [
    (3, 9, 3, 47, 92, 64),   # SmolLM2's rows: 3 query heads a key-value head
    (2, 8, 8, 40, 110, 32),  # the 3.5M model's
    (2, 4, 2, 70, 90, 128),  # a wider head
    (1, 2, 1, 5, 21, 16),    # one vector, keys not a whole vector
    (2, 2, 2, 150, 150, 48), # more queries than a block of 64, three vectors a head
])
def test_rows_with_a_mask_attend_and_differentiate_as_torch_does(kernel, rows, heads, kv_heads, queries, keys, width):
    g = torch.Generator().manual_seed(rows * queries + width)
    q = torch.randn(rows, heads, queries, width, generator=g)
    k, v = (torch.randn(rows, kv_heads, keys, width, generator=g) for _ in range(2))
    _compare(kernel, q, k, v, _row_mask(rows, queries, keys, seed=width))


@pytest.mark.parametrize("causal", [True, False])
def test_a_causal_grid_and_one_without_a_mask(kernel, causal):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 6, 33, 64, generator=g)
    k, v = (torch.randn(4, 2, 33, 64, generator=g) for _ in range(2))
    _compare(kernel, q, k, v, causal=causal, scale=0.3)


def test_one_mask_for_every_row(kernel):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(3, 4, 20, 32, generator=g)
    k, v = (torch.randn(3, 4, 50, 32, generator=g) for _ in range(2))
    _compare(kernel, q, k, v, _row_mask(1, 20, 50, seed=3))


def test_rows_laid_out_transposed_are_read_in_place_and_answered_in_their_layout(kernel):
    """The packed grids hold (rows, positions, heads, width) memory seen as (rows, heads, positions,
    width): read where they are, and the output and gradients given back in the inputs' layout."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(3, 47, 9, 64, generator=g).transpose(1, 2)
    k, v = (torch.randn(3, 92, 3, 64, generator=g).transpose(1, 2) for _ in range(2))
    got, (dq, dk, dv) = _compare(kernel, q, k, v, _row_mask(3, 47, 92, seed=5))
    assert got.stride() == dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride()
    sliced = torch.randn(3, 9, 47, 128, generator=g)[..., :64]  # rows not dense: copied first
    _compare(kernel, sliced, k, v, _row_mask(3, 47, 92, seed=5))


def test_a_query_that_attends_no_key_gives_zeros_and_no_gradient(kernel):
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 2, 8, 32, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 12, 32, generator=g, requires_grad=True) for _ in range(2))
    mask = _row_mask(2, 8, 12, seed=8)
    mask[1, 0, 3] = False
    out = grid_attention.attention(kernel, q, k, v, mask)
    assert torch.equal(out[1, :, 3], torch.zeros(2, 32))
    dq, = torch.autograd.grad(out.sum(), [q])
    assert torch.equal(dq[1, :, 3], torch.zeros(2, 32)) and dq[1, :, 2].abs().sum() > 0


def test_what_the_kernel_leaves_to_torch():
    q, k = torch.randn(1, 4, 5, 32), torch.randn(1, 2, 7, 32)
    assert grid_attention.usable(q, k, k, None)
    assert grid_attention.usable(q, k, k, torch.ones(1, 1, 5, 7, dtype=torch.bool))
    assert not grid_attention.usable(q.double(), k.double(), k.double(), None)
    assert not grid_attention.usable(q[..., :24], k[..., :24], k[..., :24], None)  # not whole vectors
    assert not grid_attention.usable(q[:, :3], k, k, None)  # 3 query heads on 2 key-value heads
    assert not grid_attention.usable(q, k, k, torch.zeros(1, 1, 5, 7))  # an additive mask
    with pytest.raises(ValueError, match="a mask or a causal grid"):
        grid_attention.attention(grid_attention.available(), q, k, k, torch.ones(1, 1, 5, 7, dtype=torch.bool),
                                 causal=True)
