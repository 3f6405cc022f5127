"""The weights inside vLLM: streaming the training engine's buckets in, rebuilding the CPU kernels
vLLM's reload leaves stale, and reading them back to check a sync (`VLLMGenerator.drift_from`)."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

Bucket = list[tuple[str, torch.Tensor]]


def flatten(buckets: Iterable[Bucket]) -> Iterator[tuple[str, torch.Tensor]]:
    for bucket in buckets:
        yield from bucket


@torch.no_grad()
def repack_kept_weights(model: torch.nn.Module) -> None:
    """Rebuild the CPU kernel of every layer that keeps its weight next to a packed copy of it (the
    embedding and the LM head: `cpu_linear` with a non-empty `weight`). A tied LM head needs it: it
    shares the embedding's weight, which the reload refills, but vLLM's loader skips `lm_head.*`
    for tied models, so the head itself is never reprocessed and its packed copy would keep the
    start-up (dummy) weights. No such layers on a GPU."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.numel() > 0:
            module.quant_method.process_weights_after_loading(module)


@torch.no_grad()
def read_model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of a vLLM model, whole. On the CPU, a linear layer's weight and the LM head's
    are read through the kernel that computes with them (x = I gives W^T exactly): the linear
    layers keep only a repacked copy, and the LM head's packed copy can differ from its weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    out = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            key = f"{module_name}.{name}" if module_name else name
            through_kernel = name == "weight" and hasattr(module, "cpu_linear") and (
                param.numel() == 0 or isinstance(module, ParallelLMHead))
            if through_kernel:
                size = getattr(module, "input_size_per_partition", None) or param.shape[1]
                eye = torch.eye(size, dtype=param.dtype)
                out[key] = module.cpu_linear(eye, None, None).t().contiguous()
            else:
                out[key] = param.detach().clone()
    return out


def expected_weights(state: dict[str, torch.Tensor], vllm_names: Iterable[str],
                     packed: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """What vLLM should hold for each of `vllm_names`, from a Hugging Face state dict: fused layers
    (`packed`, vLLM's `packed_modules_mapping`, e.g. qkv_proj -> [q_proj, k_proj, v_proj]) are the
    concatenation of their parts; a tied lm_head is the embedding."""
    out = {}
    for name in vllm_names:
        if name in state:
            out[name] = state[name]
            continue
        for fused, parts in packed.items():
            if f".{fused}." in name:
                out[name] = torch.cat([state[name.replace(f".{fused}.", f".{part}.")] for part in parts])
                break
        else:
            if name == "lm_head.weight" and "model.embed_tokens.weight" in state:
                out[name] = state["model.embed_tokens.weight"]
    return out


def weight_drift(held: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between vLLM's weights and the expected ones. vLLM pads the
    vocabulary rows of its embedding and LM head; only the real rows are compared. A weight with
    no counterpart counts as infinitely far."""
    worst = 0.0
    for name, want in expected.items():
        have = held.get(name)
        if have is None or have.shape[1:] != want.shape[1:] or have.shape[0] < want.shape[0]:
            return float("inf")
        diff = (have[:want.shape[0]].float() - want.float()).abs().max()
        worst = max(worst, float(diff))
    return worst if expected else float("inf")
