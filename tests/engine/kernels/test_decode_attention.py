"""The decoding step's attention kernel (engine/kernels/decode_attention.c) against the eager
products it replaces (two batched products and a softmax), on the shapes it meets: one or several
query heads per key-value head, the unrolled head widths and others, a prompt's left padding, rows
left by finished samples, scores too many for one thread's stack, prompts held once for their
samples (`SharedPromptCache`)."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from hflow.engine.kernels import decode_attention

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler: the kernel cannot be built here")


@pytest.fixture(scope="module")
def kernel():
    found = decode_attention.available()
    assert found is not None, "the kernel was not built on a machine with a C compiler (see the log)"
    return found


def _eager(q, keys, values, mask, end, scale):
    scores = torch.matmul(q * scale, keys[:, :, :end].transpose(-1, -2)).add_(mask[..., :end])
    return torch.matmul(scores.softmax(-1), values[:, :, :end])


def _inputs(rows, kv_heads, group, head_dim, capacity, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, kv_heads, group, head_dim, generator=g)
    keys, values = (torch.randn(rows, kv_heads, capacity, head_dim, generator=g) for _ in range(2))
    mask = torch.zeros(rows, 1, 1, capacity)
    for r in range(rows):  # row r's prompt left-padded by r % 5 columns
        mask[r, ..., :r % 5] = float("-inf")
    return q, keys, values, mask


# Widths of whole 16-float vectors (16 to 128) take the kernel's vector path, the others (24, 40, 160)
# its plain loops; an odd count of columns (37) leaves one for the values' sum after its pairs.
@pytest.mark.parametrize("group, head_dim", [(1, 32), (3, 64), (1, 128), (2, 16), (7, 48), (2, 40), (1, 160)])
@pytest.mark.parametrize("end", [6, 37, 300])
def test_the_kernel_gives_the_eager_products_attention(kernel, group, head_dim, end):
    q, keys, values, mask = _inputs(9, 2, group, head_dim, 320)
    out = kernel(q, keys, values, mask, end, head_dim ** -0.5)
    torch.testing.assert_close(out, _eager(q, keys, values, mask, end, head_dim ** -0.5), rtol=1e-5, atol=2e-6)


def test_padding_is_never_attended(kernel):
    """Values at masked columns of 1e30: any weight on them would show."""
    q, keys, values, mask = _inputs(5, 2, 2, 32, 12)
    keys[1:, :, :3], values[1:, :, :3] = 1e3, 1e30
    mask[1:, ..., :3] = float("-inf")
    out = kernel(q, keys, values, mask, 10, 0.2)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1:], _eager(q[1:], keys[1:, :, 3:], values[1:, :, 3:], mask[1:, ..., 3:], 7, 0.2),
                               rtol=1e-5, atol=2e-6)


def test_rows_of_a_compacted_cache_and_a_query_cut_from_a_wider_tensor(kernel):
    """A cache after rows left (`RowCache.select`: the buffers' first rows, their strides unchanged)
    and q as the decoding step cuts it from the rotary pass's output (rows not contiguous)."""
    q_wide, keys, values, mask = _inputs(8, 2, 3, 32, 24)
    q = q_wide.reshape(8, 6, 32)[:, :4].view(8, 2, 2, 32)  # 2 of 3 query heads per key-value head
    keys, values, mask = keys[:5], values[:5], mask[[4, 1, 0, 3, 2]]
    q = q[:5]
    assert not q.is_contiguous()
    out = kernel(q, keys, values, mask, 20, 0.3)
    torch.testing.assert_close(out, _eager(q, keys, values, mask, 20, 0.3), rtol=1e-5, atol=2e-6)


def test_more_scores_than_a_stack_holds(kernel):
    """8 query heads x 3,000 columns of scores per pair: each thread's scratch is allocated."""
    q, keys, values, mask = _inputs(2, 1, 8, 32, 3000)
    out = kernel(q, keys, values, mask, 3000, 0.1)
    torch.testing.assert_close(out, _eager(q, keys, values, mask, 3000, 0.1), rtol=1e-5, atol=2e-6)



@pytest.mark.parametrize("group, head_dim", [(1, 32), (3, 64), (2, 24)])
def test_prompts_held_once_give_the_attention_of_each_row_s_whole_cache(kernel, group, head_dim):
    """`shared`: 3 prompts of 11 columns (left padding in two), 7 rows naming them in any order, each
    with 5 columns of its own: each row's attention over its prompt's columns then its own, as the
    eager products give it over the two joined."""
    prompt_q, prompt_keys, prompt_values, prompt_mask = _inputs(3, 2, group, head_dim, 11, seed=1)
    q, keys, values, _ = _inputs(7, 2, group, head_dim, 9, seed=2)
    prompt_of = torch.tensor([2, 0, 0, 1, 2, 2, 1])
    out = kernel.shared(q, prompt_keys, prompt_values, prompt_mask, prompt_of, keys, values, 5, 0.2)
    joined_keys = torch.cat([prompt_keys[prompt_of], keys[:, :, :5]], 2)
    joined_values = torch.cat([prompt_values[prompt_of], values[:, :, :5]], 2)
    joined_mask = torch.cat([prompt_mask[prompt_of], torch.zeros(7, 1, 1, 5)], -1)
    torch.testing.assert_close(out, _eager(q, joined_keys, joined_values, joined_mask, 16, 0.2), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("group, head_dim", [(1, 32), (3, 64), (2, 24)])
def test_a_prefix_held_once_for_all_rows_gives_each_row_s_whole_attention(kernel, group, head_dim):
    """`shared` with a `prefix`: 13 columns every row reads first (one copy), then its prompt's rest
    and its own columns: the eager products' attention over the three joined."""
    _, prefix_keys, prefix_values, _ = _inputs(1, 2, group, head_dim, 13, seed=6)
    _, prompt_keys, prompt_values, prompt_mask = _inputs(3, 2, group, head_dim, 11, seed=1)
    q, keys, values, _ = _inputs(7, 2, group, head_dim, 9, seed=2)
    prompt_of = torch.tensor([2, 0, 0, 1, 2, 2, 1])
    out = kernel.shared(q, prompt_keys, prompt_values, prompt_mask, prompt_of, keys, values, 5, 0.2,
                        prefix=(prefix_keys, prefix_values))
    joined_keys = torch.cat([prefix_keys.expand(7, -1, -1, -1), prompt_keys[prompt_of], keys[:, :, :5]], 2)
    joined_values = torch.cat([prefix_values.expand(7, -1, -1, -1), prompt_values[prompt_of], values[:, :, :5]], 2)
    joined_mask = torch.cat([torch.zeros(7, 1, 1, 13), prompt_mask[prompt_of], torch.zeros(7, 1, 1, 5)], -1)
    torch.testing.assert_close(out, _eager(q, joined_keys, joined_values, joined_mask, 29, 0.2), rtol=1e-5, atol=2e-6)
    with pytest.raises(ValueError, match="prefix"):
        kernel.shared(q, prompt_keys, prompt_values, prompt_mask, prompt_of, keys, values, 5, 0.2,
                      prefix=(prefix_keys.expand(2, -1, -1, -1), prefix_values))  # one copy, not one per row


@pytest.mark.parametrize("layout", ["rows", "shared"])
def test_the_step_s_key_and_value_appended_in_the_same_pass(kernel, layout):
    """`new`: this step's keys and values, views of one tensor's rows as the decoding step's joined
    q/k/v product gives them, written into the cache's next column by the kernel itself: the same
    cache and the same attention as appending them first."""
    q, keys, values, mask = _inputs(5, 2, 3, 32, 12, seed=4)
    joined = torch.randn(5, (6 + 2 + 2) * 32)
    k, v = joined[:, 6 * 32:8 * 32].view(5, 2, 1, 32), joined[:, 8 * 32:].view(5, 2, 1, 32)
    appended_keys, appended_values = keys.clone(), values.clone()
    appended_keys[:, :, 7:8], appended_values[:, :, 7:8] = k, v
    if layout == "rows":
        want = kernel(q, appended_keys, appended_values, mask, 8, 0.3)
        got = kernel(q, keys, values, mask, 8, 0.3, new=(k, v))
    else:
        _, prompt_keys, prompt_values, prompt_mask = _inputs(2, 2, 3, 32, 6, seed=5)
        prompt_of = torch.tensor([1, 0, 1, 1, 0])
        want = kernel.shared(q, prompt_keys, prompt_values, prompt_mask, prompt_of, appended_keys, appended_values,
                             8, 0.3)
        got = kernel.shared(q, prompt_keys, prompt_values, prompt_mask, prompt_of, keys, values, 8, 0.3,
                            new=(k, v))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(keys, appended_keys) and torch.equal(values, appended_values)
    with pytest.raises(ValueError, match="new keys and values"):
        kernel(q, keys, values, mask, 8, 0.3, new=(k, v.contiguous()))  # rows of two strides


def test_a_row_naming_no_prompt_held_is_refused(kernel):
    _, prompt_keys, prompt_values, prompt_mask = _inputs(2, 1, 1, 32, 6)
    q, keys, values, _ = _inputs(3, 1, 1, 32, 4)
    with pytest.raises(ValueError, match="prompt is not among the prompts"):
        kernel.shared(q, prompt_keys, prompt_values, prompt_mask, torch.tensor([0, 2, 1]), keys, values, 3, 0.1)

@pytest.mark.parametrize("threads", [1, 2])
def test_the_result_does_not_depend_on_the_threads(kernel, threads):
    q, keys, values, mask = _inputs(16, 4, 1, 64, 40)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(q, keys, values, mask, 33, 0.125)
        torch.set_num_threads(threads)
        assert torch.equal(kernel(q, keys, values, mask, 33, 0.125), one)  # each pair on one thread
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", ["dtype", "keys_layout", "end", "mask_rows"])
def test_a_layout_the_kernel_would_misread_is_refused(kernel, bad):
    q, keys, values, mask = _inputs(4, 2, 1, 32, 16)
    end = 10
    if bad == "dtype":
        q = q.double()
    elif bad == "keys_layout":
        keys = keys.transpose(2, 3).contiguous().transpose(2, 3)
    elif bad == "end":
        end = 17
    else:
        mask = mask[:3]
    with pytest.raises(ValueError, match="decoding attention kernel"):
        kernel(q, keys, values, mask, end, 0.1)


def test_the_kernel_runs_on_torch_s_own_openmp_runtime(tmp_path):
    """The kernel's OpenMP calls go to the libgomp torch runs on (its threads are torch's, not a
    second spinning team), also in a process that loaded another libgomp first (sentencepiece's)."""
    script = """
import ctypes, importlib.util, sys
if importlib.util.find_spec("sentencepiece"):
    import sentencepiece  # its own copy of libgomp, loaded before torch's
import torch
from hflow.engine.kernels import build
library = build.load("decode_attention")
gomp_parallel = ctypes.cast(library.GOMP_parallel, ctypes.c_void_p).value
print(build.library_of(gomp_parallel), build.openmp_runtime(), sep="\\n")
"""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    used, torch_s = done.stdout.split()
    assert used == torch_s and "gomp" in used
