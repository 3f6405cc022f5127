"""A model's RMSNorms and SwiGLU MLPs fused (engine/models/fused_layers.py): the same loss and the
same gradients as transformers' own modules, through a left-padded batch, with activation
recomputation too; the modules keep their parameters and state dict; where the kernels do not
apply (bfloat16, kernels turned off) the module's own forward runs."""

import copy
import shutil

import pytest
import torch

from hflow.engine.kernels import layers
from hflow.engine.models import fused_layers
from hflow.engine.models.fused_layers import FusedMLP, FusedRMSNorm, fuse_layers

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                    reason="no C compiler: the kernels cannot be built here")


def _model(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shapes = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**shapes)).float()
    return Qwen2ForCausalLM(Qwen2Config(**shapes)).float()


def _loss_and_grads(model, checkpointing: bool = False):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 97, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.zero_grad()
    loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@needs_compiler
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_fused_layers_give_the_modules_loss_and_gradients(kind, checkpointing):
    plain = _model(kind)
    fused = copy.deepcopy(plain)
    assert fuse_layers(fused) == 2 * 2 + 1 + 2  # two norms a layer and the final one; an MLP a layer
    assert fuse_layers(fused) == 0  # already fused: nothing changes
    assert fused.state_dict().keys() == plain.state_dict().keys()
    assert type(fused.model.norm).__name__ == type(plain.model.norm).__name__
    assert isinstance(fused.model.norm, type(plain.model.norm))
    calls = []
    kernels = layers.available()
    assert kernels is not None, "the kernels were not built on a machine with a C compiler (see the log)"
    original = fused_layers.layers.available
    try:
        fused_layers.layers.available = lambda: calls.append(1) or kernels
        want_loss, want = _loss_and_grads(plain, checkpointing)
        got_loss, got = _loss_and_grads(fused, checkpointing)
    finally:
        fused_layers.layers.available = original
    assert len(calls) >= 2 * 2 + 1 + 2  # every fused module took the kernels' path
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_where_the_kernels_do_not_apply_the_module_s_own_forward_runs(monkeypatch):
    """bfloat16 (as on a GPU) never asks for the kernels; turned off, the float32 path is torch's."""
    asked = []
    monkeypatch.setattr(fused_layers.layers, "available", lambda: asked.append(1))
    model = _model("llama")
    fuse_layers(model)
    assert isinstance(model.model.norm, FusedRMSNorm) and isinstance(model.model.layers[0].mlp, FusedMLP)
    ids = torch.randint(3, 97, (2, 5))
    with torch.no_grad():
        plain_logits = _model("llama")(input_ids=ids).logits
        logits = model(input_ids=ids).logits  # asks, is told None: torch's operators
        assert asked and torch.equal(logits, plain_logits)
        asked.clear()
        model.to(torch.bfloat16)(input_ids=ids)
    assert not asked


def test_a_fused_model_pickles_and_copies_fused():
    """The fused classes are made at run time: a fused module pickles as its base class fused again."""
    import pickle

    model = _model("qwen2")
    fuse_layers(model)
    ids = torch.randint(3, 97, (2, 5))
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert isinstance(other.model.norm, FusedRMSNorm) and isinstance(other.model.layers[1].mlp, FusedMLP)
        assert isinstance(other.model.norm, type(_model("qwen2").model.norm))
        with torch.no_grad():
            assert torch.equal(other(input_ids=ids).logits, model(input_ids=ids).logits)
