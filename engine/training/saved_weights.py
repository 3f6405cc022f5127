"""A trained role's checkpointed weights, read into a module that will not train (an evaluation).

`TrainEngine.save` writes the role's trained parameters (all of them, or a LoRA run's adapters)
whole and in float32 to `weights.safetensors`, each under its name in the module. A model that
only generates needs those weights alone: `load_saved_weights` copies each into the parameter of
that name, rounded to the module's dtype as the engine rounds its float32 masters into its
bfloat16 weights, and builds no DeepSpeed engine, no gradients and no optimizer state. Under
bfloat16 and ZeRO-1/2 that state (float32 masters, gradient buffers, Adam's moments) holds about
seven times the weights' own memory. Under ZeRO-3 (a model built partitioned, `zero3.py`) each
parameter is gathered while it is written.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from hflow.errors import UserError

WEIGHTS_FILE = "weights.safetensors"  # a trained role's weights in its checkpoint folder (`TrainEngine.save`)


def load_saved_weights(module: torch.nn.Module, directory: Path) -> None:
    """The trained parameters of `module` (those that require gradients: all, or LoRA's adapters)
    from `directory`/weights.safetensors. The file must hold exactly those names, in their shapes:
    a checkpoint of another model, or of a run with other `actor.lora` settings, is refused in one
    line."""
    from safetensors import safe_open

    trained = {name: p for name, p in module.named_parameters() if p.requires_grad}
    path = Path(directory) / WEIGHTS_FILE
    with safe_open(str(path), "pt") as saved:
        _check_names(path, set(saved.keys()), set(trained))
        for name, param in trained.items():  # every shape before any write: a refused file changes nothing
            shape = tuple(getattr(param, "ds_shape", param.shape))  # a ZeRO-3 partition's whole shape
            found = tuple(saved.get_slice(name).get_shape())
            if found != shape:
                raise UserError(f"{path}: {name} has shape {found}, the recipe's model {shape}: the checkpoint "
                                "is of another model")
        for name, param in trained.items():
            with _whole(param), torch.no_grad():
                param.copy_(saved.get_tensor(name))


def _whole(param: torch.nn.Parameter):
    """The parameter whole while it is written: a ZeRO-3 partition is gathered, and rank 0's values
    (every rank reads the same file) partitioned again afterwards."""
    if not hasattr(param, "ds_id"):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=0)


def _check_names(path: Path, saved: set[str], trained: set[str]) -> None:
    """Refuse a file whose tensors are not the module's trained parameters, naming one of each."""
    if saved == trained:
        return
    missing, extra = sorted(trained - saved), sorted(saved - trained)
    said = []
    if missing:
        said.append(f"lacks {len(missing)} of the recipe's trained parameters ({missing[0]}, ...)")
    if extra:
        said.append(f"holds {len(extra)} the recipe's model does not train ({extra[0]}, ...)")
    raise UserError(f"{path}: {' and '.join(said)}: the checkpoint is of another model, or of a run "
                    "with other actor.lora settings")
