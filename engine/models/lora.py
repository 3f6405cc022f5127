"""LoRA adapters on a trained role's model (Hu et al. 2021, arXiv 2106.09685), through peft.

A LoRA layer computes W x + (alpha / r) B A x: the base weight W stays frozen and only A (r x in)
and B (out x r, zero at the start) train, so the optimizer holds Adam moments for the adapters
alone. Three views of one model serve the rest of hflow:

  the model with adapters      training, `hf` generation, the policy's log-probs
  adapters switched off        the reference's log-probs (`peft`'s `disable_adapter()`): the
                               frozen base weights ARE the initial policy, so no second copy
  merged weights               W + (alpha / r) B A under the base model's own parameter names:
                               what the `vllm` engine loads and `final/` saves; computed per layer
                               (peft's `get_delta_weight`), never by merging into the trained module
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn

from hflow.engine.specs import LoraSpec
from hflow.errors import UserError

ADAPTER = "default"  # peft's name of the one adapter hflow trains
ADAPTER_DIR = "adapter"  # final/adapter/: adapter_config.json + adapter_model.safetensors


def linear_names(model: nn.Module) -> list[str]:
    """The distinct last parts of the names of `model`'s linear layers (what `target_modules` matches)."""
    from transformers.pytorch_utils import Conv1D

    names = {name.rpartition(".")[2] for name, module in model.named_modules()
             if isinstance(module, (nn.Linear, Conv1D)) and name}
    return sorted(names)


def check_targets(model: nn.Module, targets: str | tuple[str, ...], what: str, path: str) -> None:
    """Every target names a linear layer of `model`, or one line naming it and those that exist."""
    if targets == "all-linear":
        return
    existing = linear_names(model)
    for target in targets:
        if target not in existing:
            raise UserError(f"{what}.lora.target_modules: model '{path}' has no linear layer {target!r}; "
                            f"its linear layers: {', '.join(existing)} (or all-linear)")


def check_folder_targets(path: str, targets: str | tuple[str, ...], what: str, causal_lm: bool = True,
                         trust_remote_code: bool = False) -> None:
    """`check_targets` against the model a folder's config.json describes, built on the meta device
    (no weights are read): lets `hflow validate` and the start of `hflow train` refuse a bad target."""
    if targets == "all-linear":
        return
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        cls = AutoModelForCausalLM if causal_lm else AutoModel
        model = cls.from_config(config, trust_remote_code=trust_remote_code)
    check_targets(model, targets, what, path)


def apply_lora(model: nn.Module, spec: LoraSpec, what: str, path: str, causal_lm: bool = True) -> nn.Module:
    """`model` wrapped by peft with fresh adapters: its own weights frozen, the adapters trainable.
    Adapter initialisation draws from torch's global generator (A: Kaiming-uniform; B is zero)."""
    from peft import LoraConfig, get_peft_model

    check_targets(model, spec.target_modules, what, path)
    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=targets,
                        task_type="CAUSAL_LM" if causal_lm else None)
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # e.g. a target that names a module peft cannot adapt
        raise UserError(f"{what}.lora: model '{path}': {str(err).splitlines()[0]}") from None


def is_lora(module: nn.Module) -> bool:
    return hasattr(module, "disable_adapter") and hasattr(module, "get_base_model")


def adapters_off(module: nn.Module):
    """Within the block `module` computes with its base weights only (a no-op without LoRA)."""
    return module.disable_adapter() if is_lora(module) else contextlib.nullcontext()


MergedWeight = tuple[str, list[nn.Parameter], Callable[[], torch.Tensor]]


def merged_weights(module: nn.Module) -> list[MergedWeight]:
    """Every weight of the plain model, in `named_parameters()` order, as (base-model name, the
    parameters it is computed from, a function computing it). A LoRA layer's weight is its frozen
    base weight plus the adapter's delta, (alpha / r) B A; everything else is the parameter itself.
    Without LoRA, every parameter as it is. The functions need the listed parameters whole (under
    ZeRO-3: gathered) and return tensors that must not be written to."""
    if not is_lora(module):
        return [(name, [p], _reader(p)) for name, p in module.named_parameters()]
    from peft.tuners.lora import LoraLayer

    base = module.get_base_model()
    layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    out = []
    for name, param in base.named_parameters():
        owner, _, leaf = name.rpartition(".")
        layer_name = owner.removesuffix(".base_layer")
        if ".lora_" in name:
            continue  # an adapter's A or B: folded into its layer's weight below
        layer = layers.get(layer_name) if owner.endswith(".base_layer") else None
        plain = f"{layer_name}.{leaf}" if layer is not None else name
        if layer is not None and leaf == "weight":
            sources = [param, *layer.lora_A[ADAPTER].parameters(), *layer.lora_B[ADAPTER].parameters()]
            out.append((plain, sources, _merger(param, layer)))
        else:
            out.append((plain, [param], _reader(param)))
    return out


def _reader(param: nn.Parameter) -> Callable[[], torch.Tensor]:
    return lambda: param.data


def _merger(param: nn.Parameter, layer) -> Callable[[], torch.Tensor]:
    @torch.no_grad()
    def merged() -> torch.Tensor:
        return param.data + layer.get_delta_weight(ADAPTER).to(param.dtype)

    return merged


def merged_state(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, merged weight) of the plain model, one at a time (parameters must be whole)."""
    for name, _, value in merged_weights(module):
        yield name, value()


def save_merged(module: nn.Module, directory: str) -> None:
    """A plain Hugging Face model directory of the merged weights, loadable without peft, and the
    adapters in peft's own format under `directory/adapter/`."""
    from pathlib import Path

    state = {name: tensor.detach().clone() for name, tensor in merged_state(module)}
    module.get_base_model().save_pretrained(directory, state_dict=state, safe_serialization=True)
    module.save_pretrained(str(Path(directory) / ADAPTER_DIR), safe_serialization=True)
