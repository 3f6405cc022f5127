"""A cheap look at a local model folder before anything loads it.

Loading a broken folder fails deep inside transformers or safetensors, in a worker, after
the run directory exists: an empty folder is reported as a sentencepiece problem, a
truncated weight file as a Rust panic. `folder_problem` reads only small files and the
safetensors headers (`safetensors_header.py`; no tensor is loaded) and says in words what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

from hflow.engine.models.safetensors_header import read_layout
from hflow.errors import UserError

ACCEPTED = ("a Hugging Face model folder: config.json with a model_type, tokenizer.json (or tokenizer_config.json "
            "with its vocabulary files), and model.safetensors, sharded *.safetensors with "
            "model.safetensors.index.json, or pytorch_model.bin")
# Files that hold a slow tokenizer's vocabulary next to tokenizer_config.json: vocab.json or
# vocab.txt (BPE, WordPiece), *.model (sentencepiece), *.tiktoken.
VOCAB_SUFFIXES = (".model", ".tiktoken")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
MAX_HEADER = 100_000_000  # the safetensors library's own limit on N


def folder_problem(folder: Path, tokenizer: bool = True, model: bool = True) -> str | None:
    """What makes `folder` not loadable, in words ('has no config.json'), or None. `tokenizer`:
    whether the folder's own tokenizer is read (a critic's or reference's is not); `model`:
    whether its model is (config and weights; not when only its tokenizer is loaded)."""
    if not any(folder.iterdir()):
        return "is empty"
    return ((model and _config_problem(folder)) or (tokenizer and _tokenizer_problem(folder))
            or (model and _weights_problem(folder)) or None)


def _config_problem(folder: Path) -> str | None:
    path = folder / "config.json"
    if not path.is_file():
        return "has no config.json"
    text = path.read_text(errors="replace")
    if not text.strip():
        return "has an empty config.json"
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        return f"has a config.json that is not valid JSON ({err})"
    if not isinstance(config, dict):
        return f"has a config.json that is not a JSON object (a {type(config).__name__})"
    if not config.get("model_type"):
        return "has a config.json without a model_type"
    return None


def _tokenizer_problem(folder: Path) -> str | None:
    if (folder / "tokenizer.json").is_file():
        return None
    if (folder / "tokenizer_config.json").is_file() and any(
            p.name.startswith("vocab.") or p.suffix in VOCAB_SUFFIXES for p in folder.iterdir()):
        return None
    return "has no tokenizer (tokenizer.json, or tokenizer_config.json with vocab.json, vocab.txt or tokenizer.model)"


def _weights_problem(folder: Path) -> str | None:
    for name in WEIGHTS:
        index = folder / f"{name}.index.json"
        if index.is_file():
            return _shards_problem(index)
        if (folder / name).is_file():
            return safetensors_problem(folder / name) if name.endswith(".safetensors") else _bin_problem(folder / name)
    return "has no weights (model.safetensors, model.safetensors.index.json with its shards, or pytorch_model.bin)"


def _shards_problem(index: Path) -> str | None:
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"has an {index.name} that is not a JSON object with a weight_map"
    for shard in shards:
        path = index.parent / shard
        if not path.is_file():
            return f"has no {shard}, a shard that {index.name} lists"
        problem = safetensors_problem(path) if shard.endswith(".safetensors") else _bin_problem(path)
        if problem:
            return problem
    return None


def _bin_problem(path: Path) -> str | None:
    return f"has an empty {path.name}" if path.stat().st_size == 0 else None


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with the safetensors file `path` by its header and length, or None."""
    layout = read_layout(path)
    size, length = layout.size, layout.header_end - 8
    if size < 8:
        return f"has a {path.name} of {size} bytes, cut short before its 8-byte header length"
    if length > MAX_HEADER:
        return f"has a {path.name} that is not a safetensors file (header length {length})"
    if layout.header_end > size:
        return f"has a {path.name} cut short: {size} bytes, less than its {layout.header_end}-byte header"
    if layout.data_end is None:
        return f"has a {path.name} whose header is not safetensors JSON"
    if size < layout.data_end:
        return f"has a {path.name} cut short: {size} bytes where its header says {layout.data_end}"
    if size > layout.data_end:
        return f"has a {path.name} of {size} bytes where its header says {layout.data_end}"
    return None


HUB_PROBE_TIMEOUT_S = 5.0


def hub_problem(repo: str) -> str | None:
    """Why the Hugging Face hub id `repo` cannot be loaded now, or None: it is in the local cache,
    or the hub answers. Asked once before a run (transformers itself retries an unreachable hub
    for about a minute, then fails with a long traceback)."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo, "config.json"), str):
        return None
    if constants.HF_HUB_OFFLINE:
        return "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
    try:
        HfApi().model_info(repo, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as err:  # no network, no such repo, a gated one: each says so in its first line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return f"is not in the local Hugging Face cache and the hub cannot give it ({type(err).__name__}: {first})"
    return None


def check_model_source(path: str, what: str, tokenizer: bool = True, model: bool = True) -> None:
    """A missing or broken local directory is a user error naming `what` (the recipe key, when
    known); a hub id is left to the hub's cache. `tokenizer`, `model`: whether the folder's own
    tokenizer and model are read (see `folder_problem`). `org/name` is a hub id unless
    `org` is a folder here (`models/tiny-reward-digits` before `hflow init-model` made it)."""
    p = Path(path)
    looks_local = (p.is_absolute() or path.startswith((".", "~")) or p.exists() or path.count("/") != 1
                   or Path(path.split("/")[0]).is_dir())
    if looks_local and not p.is_dir():
        raise UserError(
            f"{what}: model path '{path}' does not exist"
            + ("" if p.is_absolute() else f" (looked for {p.absolute()})")
            + "; give a local Hugging Face model directory "
            "(build a tiny one with `hflow init-model tiny DIR` or `hflow init-model tiny-reward DIR`, "
            "or set `model.init: tiny`)"
        )
    problem = folder_problem(p, tokenizer, model) if looks_local else None
    if problem:
        raise UserError(f"{what}: model folder '{path}' {problem}; give {ACCEPTED}")
