"""CPU products through oneDNN (`engine/kernels/cpu_products.py`) against torch's own, in float64, and the route
that sends each kind of a layer's products one way or the other (`engine/kernels/product_route.py`)."""

import os
import platform
import subprocess
import sys

import pytest
import torch
from torch import nn

from hflow.engine.kernels import cpu_products, product_route
from hflow.engine.kernels.product_route import ProductChoiceError, RoutedLinear, linear, route_linears, routes
from hflow.errors import UserError
from helpers import choose_cpu_products

needs_onednn = pytest.mark.skipif(not cpu_products.onednn_available(), reason="this torch has no oneDNN")


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach()).abs().max() / b.detach().abs().max())


@pytest.fixture
def onednn(monkeypatch):
    choose_cpu_products(monkeypatch, "onednn")


@needs_onednn
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_the_three_products_of_a_linear_layer_match_float64(onednn, bias, contiguous):
    """y = x W^T + b and the gradients of x, W and b, for a (2, 7, 48) input, contiguous or a
    transposed view: within float32's rounding of the float64 results."""
    torch.manual_seed(0)
    x64 = torch.randn(2, 7, 48, dtype=torch.float64, requires_grad=True)
    w64 = (torch.randn(40, 48, dtype=torch.float64) * 0.1).requires_grad_()
    b64 = torch.randn(40, dtype=torch.float64, requires_grad=True) if bias else None
    grad = torch.randn(2, 7, 40, dtype=torch.float64)
    ref = torch.nn.functional.linear(x64, w64, b64)
    ref.backward(grad)
    leaves = [t for t in (x64, w64, b64) if t is not None]
    x, w, b = (None if t is None else t.detach().float().requires_grad_() for t in (x64, w64, b64))
    if not contiguous:
        x = x.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
        assert not x.is_contiguous()
    out = linear(x, w, b)
    assert routes(w) and out.grad_fn is not None and "Linear" in type(out.grad_fn).__name__
    out.backward(grad.float())
    assert _relative(out, ref) < 1e-5
    for got, want in zip([t for t in (x, w, b) if t is not None], leaves):
        assert got.grad.shape == want.shape and _relative(got.grad, want.grad) < 1e-5


@needs_onednn
def test_a_frozen_weight_gets_no_gradient_and_no_grad_calls_build_no_graph(onednn):
    """A LoRA base layer: the input's gradient only. Under no_grad: the same values, no graph."""
    torch.manual_seed(1)
    x = torch.randn(5, 16, requires_grad=True)
    w = torch.randn(8, 16)
    linear(x, w).sum().backward()
    torch.testing.assert_close(x.grad, w.sum(0).expand(5, 16), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        out = linear(x, w)
    assert out.grad_fn is None
    torch.testing.assert_close(out, x.detach() @ w.t(), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_route_linears_keeps_parameters_and_matches_the_plain_layers(onednn):
    """Plain nn.Linear layers become RoutedLinear (subclasses are left alone), with the same
    parameters and state dict, and compute what they computed before."""
    class Head(nn.Linear):
        pass

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 6, bias=False), Head(6, 1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(9, 12)
    expected = model(x)
    assert route_linears(model) == 2
    assert [type(m).__name__ for m in model] == ["RoutedLinear", "ReLU", "RoutedLinear", "Head"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-6)


def test_products_stay_torch_s_where_onednn_does_not_apply(onednn):
    """bfloat16 weights and ZeRO-3's partitioned parameters (`ds_id`) keep F.linear: the same bits."""
    assert routes(torch.randn(4, 4)) == cpu_products.onednn_available()
    layer = RoutedLinear(16, 8).bfloat16()
    x = torch.randn(3, 16).bfloat16()
    assert not routes(layer.weight)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    partitioned = nn.Parameter(torch.randn(4, 4))
    partitioned.ds_id = 0
    assert not routes(partitioned)


@pytest.mark.parametrize("value", ["mkl", "onednn,blas", "onednn,blas,mkl", "onednn,,blas"])
def test_a_bad_choice_is_one_line_naming_the_variable(monkeypatch, value):
    choose_cpu_products(monkeypatch, value)
    with pytest.raises(ProductChoiceError) as err:
        product_route.chosen_route()
    assert isinstance(err.value, UserError)
    assert str(err.value) == (f"environment HFLOW_CPU_PRODUCTS={value!r}: accepted values are auto, onednn, blas, "
                              "or one of onednn and blas for each of forward, input_grad, weight_grad "
                              "(onednn,onednn,blas)")


@pytest.mark.parametrize("text, route", [("onednn", ("onednn",) * 3), (" BLAS ", ("blas",) * 3),
                                         ("onednn, onednn,blas", ("onednn", "onednn", "blas")),
                                         ("blas,onednn,blas", ("blas", "onednn", "blas"))])
def test_a_route_reads_as_one_library_or_one_per_kind_and_writes_back_the_same(text, route):
    assert product_route.parse_route(text) == route
    assert product_route.parse_route(product_route.route_text(route)) == route
    assert product_route.route_text(("onednn",) * 3) == "onednn"


def test_blas_is_kept_when_asked(monkeypatch):
    choose_cpu_products(monkeypatch, "blas")
    assert not routes(torch.randn(4, 4))


@pytest.mark.parametrize("choice", ["blas", "onednn"])
def test_the_decoding_step_packs_wherever_onednn_runs_whichever_route_the_passes_take(monkeypatch, choice):
    """The passes' route is the variable's; a decoding step's thin products go through oneDNN on
    reordered weights wherever it runs (float32, or bfloat16 where oneDNN takes it), never for
    ZeRO-3's partitioned parameters or half precision."""
    choose_cpu_products(monkeypatch, choice)
    weight = torch.randn(4, 4)
    assert routes(weight) == (choice == "onednn" and cpu_products.onednn_available())
    assert cpu_products.decodes_packed(weight) == cpu_products.onednn_available()
    assert cpu_products.decodes_packed(weight.bfloat16()) == (cpu_products.onednn_available()
                                                              and cpu_products._onednn_takes_bf16())
    assert not cpu_products.decodes_packed(weight.half())
    partitioned = nn.Parameter(weight.clone())
    partitioned.ds_id = 0
    assert not cpu_products.decodes_packed(partitioned)


def _train_three_steps(tiny_model, choice: str, monkeypatch) -> tuple[list[float], torch.Tensor, int]:
    """(losses, trained LM head, oneDNN products run)."""
    from hflow.engine.models.loading import load_causal_lm

    calls = []
    product = cpu_products.product
    monkeypatch.setattr(cpu_products, "product", lambda *args: calls.append(1) or product(*args))
    choose_cpu_products(monkeypatch, choice)
    torch.manual_seed(3)
    model = load_causal_lm(str(tiny_model), torch.float32)
    assert routes(model.lm_head.weight) == (choice == "onednn")
    ids = torch.randint(3, model.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # (AdamW's first steps are the gradients' signs)
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, model.lm_head.weight.detach(), len(calls)


@needs_onednn
def test_training_a_tiny_llama_through_onednn_follows_the_blas_run(tiny_model, monkeypatch):
    """Three SGD steps on a tiny Llama loaded as hflow loads models: the loss falls, and every
    step's loss and the trained head agree between oneDNN's products and the BLAS's."""
    blas_losses, blas_head, none = _train_three_steps(tiny_model, "blas", monkeypatch)
    dnn_losses, dnn_head, products = _train_three_steps(tiny_model, "onednn", monkeypatch)
    # 15 layers' forward, input-gradient and weight-gradient products in each step (the embedding
    # is a lookup; the first layer's input needs no gradient)
    assert none == 0 and products >= 3 * 15 * 2
    assert dnn_losses[-1] < dnn_losses[0] - 0.1
    assert dnn_losses == pytest.approx(blas_losses, rel=1e-4)
    torch.testing.assert_close(dnn_head, blas_head, rtol=1e-3, atol=1e-4)


GROWTH = """
import ctypes, torch
from hflow.engine.kernels.cpu_products import product
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = Info
torch.set_num_threads(1)
w = torch.randn(64, 32)
used = []
for i in range(600):
    product(torch.randn(100 + i, 32), w)  # a new shape every call, as a run's token counts
    if i in (199, 599):
        used.append(libc.mallinfo2().uordblks)
print((used[1] - used[0]) / 2**20)
"""


@needs_onednn
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="reads glibc's heap statistics")
def test_products_of_ever_new_shapes_do_not_grow_the_process_without_bound():
    """oneDNN caches a primitive per product shape, 1,024 of them in each of its two caches by
    default: the heap in use grew by about half a MiB for each new shape. Bounded on import; the
    caller's own capacity wins (the defaults, given explicitly, bring the growth back)."""
    def growth(**env) -> float:
        clean = {k: v for k, v in os.environ.items() if k not in cpu_products.CACHE_KEYS}
        done = subprocess.run([sys.executable, "-c", GROWTH], env={**clean, **env}, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return float(done.stdout.split()[-1])

    assert growth() < 16  # MiB in use added by the last 400 shapes
    assert growth(**{key: "1024" for key in cpu_products.CACHE_KEYS}) > 100


def _measured_as(monkeypatch, ratio: float) -> list:
    """`faster_by` answering `ratio` (oneDNN's time over the BLAS's), its calls counted."""
    calls = []
    monkeypatch.setattr(product_route, "faster_by", lambda *a: calls.append(1) or ratio)
    return calls


@pytest.mark.skipif(not cpu_products.onednn_available(), reason="needs oneDNN in torch")
def test_a_run_keeps_the_choice_it_began_with(monkeypatch, tmp_path):
    """A resume takes the recorded choice without measuring, and exports it for the processes it
    starts; where nothing is recorded (or the record is no choice) the run takes the machine's,
    measured by the first run here (`machine_choice`, tests/engine/test_product_choice.py). The
    run's end gives the process its environment back."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    choose_cpu_products(monkeypatch, "auto")
    monkeypatch.delenv(product_route.ENV)
    calls = _measured_as(monkeypatch, 0.3)  # oneDNN clearly faster here, now, for every kind
    settled = product_route.settle("blas")
    assert settled.choice == "blas" and not routes(torch.randn(4, 4))
    assert calls == [] and os.environ[product_route.ENV] == "blas"
    settled.restore()
    assert product_route.ENV not in os.environ and calls == []
    for recorded in (None, "mkl"):
        settled = product_route.settle(recorded)
        assert settled.choice == "onednn" and os.environ[product_route.ENV] == "onednn"
        assert product_route.settle("blas").choice == "onednn"  # inside the run, its choice holds
        settled.restore()
    assert len(calls) == len(product_route.KINDS)  # each kind, by the first run on this machine; none inside a run


def test_the_user_s_choice_beats_the_recorded_one(monkeypatch):
    choose_cpu_products(monkeypatch, "blas")
    calls = _measured_as(monkeypatch, 0.3)
    settled = product_route.settle("onednn")
    assert settled.choice == "blas" and calls == []
    settled.restore()
    assert os.environ[product_route.ENV] == "blas"


@needs_onednn
@pytest.mark.parametrize("kind", product_route.KINDS)
def test_the_probe_times_the_same_product_both_ways_on_one_thread(monkeypatch, kind):
    """Each kind's two ways (`probe_ways`) compute the same product as `_Linear` computes it, each
    direction through the layer; oneDNN's way is timed on one thread, every call; the caller's
    thread count is back afterwards, also when a way fails."""
    for dnn, blas in product_route.probe_ways(kind, rows=24, shape=(16, 40)):
        got, want = dnn(), blas()
        assert got.shape == want.shape and _relative(got, want.double()) < 1e-5
    threads = []
    product = cpu_products.product
    monkeypatch.setattr(cpu_products, "product", lambda *a: threads.append(torch.get_num_threads()) or product(*a))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert product_route.faster_by(kind, rows=24, shape=(16, 40), rounds=3) > 0
        assert threads == [1] * 2 * 4  # two directions: a first call, then 3 rounds
        assert torch.get_num_threads() == 2

        def broken(*args):
            raise RuntimeError("no kernel")

        monkeypatch.setattr(cpu_products, "product", broken)
        with pytest.raises(RuntimeError, match="no kernel"):
            product_route.faster_by(kind, rows=24, shape=(16, 40))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@needs_onednn
@pytest.mark.parametrize("route", ["onednn,onednn,blas", "blas,onednn,blas", "blas,blas,onednn", "onednn,blas,onednn"])
def test_each_product_of_a_layer_goes_through_the_library_its_kind_is_routed_to(monkeypatch, route):
    """A layer's forward, input gradient and weight gradient: through oneDNN exactly where the route
    says so (the BLAS elsewhere), with the same values and gradients as F.linear's in float64."""
    choose_cpu_products(monkeypatch, route)
    shapes = []
    product = cpu_products.product
    monkeypatch.setattr(cpu_products, "product", lambda a, b, *r: shapes.append((tuple(a.shape), tuple(b.shape)))
                        or product(a, b, *r))
    torch.manual_seed(5)
    x64 = torch.randn(6, 12, dtype=torch.float64, requires_grad=True)
    w64 = (torch.randn(10, 12, dtype=torch.float64) * 0.1).requires_grad_()
    grad = torch.randn(6, 10, dtype=torch.float64)
    ref = torch.nn.functional.linear(x64, w64)
    ref.backward(grad)
    x, w = (t.detach().float().requires_grad_() for t in (x64, w64))
    out = linear(x, w)
    out.backward(grad.float())
    assert _relative(out, ref) < 1e-5
    assert _relative(x.grad, x64.grad) < 1e-5 and _relative(w.grad, w64.grad) < 1e-5
    kinds = {((6, 12), (10, 12)): "forward", ((6, 10), (12, 10)): "input_grad", ((10, 6), (12, 6)): "weight_grad"}
    assert [kinds[s] for s in shapes] == [k for k, library in zip(product_route.KINDS, route.split(","))
                                          if library == "onednn"]


@needs_onednn
def test_a_weight_gradient_through_onednn_copies_dy_transposed_by_the_kernel_to_the_same_bits(monkeypatch):
    """dW = dy^T x with dy^T put in rows by the transpose kernel: the same bits as oneDNN copying it
    itself, and the kernel is what ran."""
    from hflow.engine.kernels import transpose

    g = torch.Generator().manual_seed(3)
    grad, rows = torch.randn(300, 1536, generator=g), torch.randn(300, 576, generator=g)
    plain = cpu_products.product(grad.t(), rows.t())  # oneDNN's own copy of grad^T
    calls = []
    real = transpose.in_rows
    monkeypatch.setattr(cpu_products, "in_rows", lambda t: calls.append(t.shape) or real(t))
    got = cpu_products.weight_grad_product(grad, rows, onednn=True)
    assert calls == [(1536, 300)] and torch.equal(got, plain)
