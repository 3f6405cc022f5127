"""Model shapes for the auto-mapper: a built-in catalog, or a local directory's config.json.

Only the shape matters to the cost model (layers, widths, heads, vocabulary): the mapper
never loads weights. Every catalog entry is copied from the model's `config.json` on the
Hugging Face hub (the hub id is the key), and is also reachable by a short name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hflow.errors import UserError


@dataclass(frozen=True)
class ModelShape:
    """A Llama/Qwen-style decoder: RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 has biases on q, k and v

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections, the SwiGLU MLP and two norms."""
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim
        bias = (self.hidden + 2 * self.kv_dim) if self.qkv_bias else 0
        return attn + bias + 3 * self.hidden * self.ffn + 2 * self.hidden

    def params(self, lm_head: bool = True) -> int:
        """All weights. `lm_head=False`: a critic or reward model, whose head is hidden x 1."""
        embed = self.vocab * self.hidden
        if lm_head:
            head = 0 if self.tied_embeddings else self.vocab * self.hidden
        else:
            head = self.hidden
        return embed + self.layers * self.layer_params + self.hidden + head

    def matmul_params(self, lm_head: bool = True) -> int:
        """Weights used in matrix products per token (the embedding lookup is not one)."""
        head = self.vocab * self.hidden if lm_head else self.hidden
        return self.layers * self.layer_params + head

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache per token: keys and values of every layer."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


def _llama(name, layers, hidden, heads, kv_heads, ffn, vocab, tied=False):
    return ModelShape(name, layers, hidden, heads, kv_heads, ffn, vocab, tied, qkv_bias=False)


def _qwen2(name, layers, hidden, heads, kv_heads, ffn, vocab, tied=False):
    return ModelShape(name, layers, hidden, heads, kv_heads, ffn, vocab, tied, qkv_bias=True)


# Source: each model's config.json on huggingface.co (num_hidden_layers, hidden_size,
# num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings).
_CATALOG: list[tuple[ModelShape, tuple[str, ...]]] = [
    (_llama("meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 11008, 32000),
     ("llama2-7b", "meta-llama/Llama-2-7b-chat-hf")),
    (_llama("meta-llama/Llama-2-13b-hf", 40, 5120, 40, 40, 13824, 32000),
     ("llama2-13b", "meta-llama/Llama-2-13b-chat-hf")),
    (_llama("meta-llama/Llama-2-70b-hf", 80, 8192, 64, 8, 28672, 32000),
     ("llama2-70b", "meta-llama/Llama-2-70b-chat-hf")),
    # CodeLlama-34B: the paper's 34B model (its reference [6]); 32000 tokens, unlike 7B/13B's 32016.
    (_llama("codellama/CodeLlama-34b-hf", 48, 8192, 64, 8, 22016, 32000),
     ("codellama-34b", "codellama/CodeLlama-34b-Instruct-hf")),
    (_llama("meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256),
     ("llama3-8b", "llama3.1-8b", "meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct",
      "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct")),
    (_llama("meta-llama/Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256),
     ("llama3-70b", "llama3.1-70b", "llama3.3-70b", "meta-llama/Meta-Llama-3-70B",
      "meta-llama/Meta-Llama-3-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct",
      "meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B")),
    (_qwen2("Qwen/Qwen2.5-0.5B", 24, 896, 14, 2, 4864, 151936, tied=True), ("qwen2.5-0.5b",)),
    (_qwen2("Qwen/Qwen2.5-1.5B", 28, 1536, 12, 2, 8960, 151936, tied=True), ("qwen2.5-1.5b",)),
    (_qwen2("Qwen/Qwen2.5-3B", 36, 2048, 16, 2, 11008, 151936, tied=True), ("qwen2.5-3b",)),
    (_qwen2("Qwen/Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064), ("qwen2.5-7b",)),
    (_qwen2("Qwen/Qwen2.5-14B", 48, 5120, 40, 8, 13824, 152064), ("qwen2.5-14b",)),
    (_qwen2("Qwen/Qwen2.5-32B", 64, 5120, 40, 8, 27648, 152064), ("qwen2.5-32b",)),
    (_qwen2("Qwen/Qwen2.5-72B", 80, 8192, 64, 8, 29568, 152064), ("qwen2.5-72b",)),
    # The models `hflow init-model` builds locally (engine/models/loading.py TINY_SHAPES; 55-character vocabulary),
    # for recipes with `model.init: tiny` whose directory does not exist yet.
    (_llama("tiny", 2, 64, 4, 4, 192, 55), ()),
    (_llama("small", 4, 256, 8, 8, 768, 55), ()),
]


def _index() -> dict[str, ModelShape]:
    index: dict[str, ModelShape] = {}
    for shape, aliases in _CATALOG:
        names = {shape.name, *aliases}
        if "/" in shape.name and shape.name.startswith("Qwen/"):
            names.add(shape.name + "-Instruct")  # Qwen/Qwen2.5-7B-Instruct has the base model's shape
        for name in names:
            index[name.lower()] = shape
    return index


MODELS: dict[str, ModelShape] = _index()


def catalog_names() -> list[str]:
    """The short names, for error messages and `--help`."""
    return [aliases[0] for shape, aliases in _CATALOG if aliases]


def shape_from_config(path: Path) -> ModelShape:
    """The shape in a Hugging Face `config.json` (a Llama/Qwen-like decoder)."""
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: cannot read the model config: {err}") from None
    config = config.get("text_config", config)  # multimodal configs nest the language model
    needed = ["num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"]
    missing = [key for key in needed if not isinstance(config.get(key), int)]
    if missing:
        raise UserError(f"{path}: not a Llama/Qwen-like config, missing {', '.join(missing)}")
    heads = config["num_attention_heads"]
    return ModelShape(
        name=str(path.parent),
        layers=config["num_hidden_layers"],
        hidden=config["hidden_size"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        ffn=config["intermediate_size"],
        vocab=config["vocab_size"],
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
    )


# Fine-tunes keep their base model's shape and usually its name: "Skywork-Reward-Llama-3.1-8B"
# has Llama-3.1-8B's shape. Checked in order; the first match wins.
_NAME_PATTERNS = [
    (r"codellama-?34b", "codellama-34b"),
    (r"llama-?2-?(7|13|70)b", "llama2-{0}b"),
    (r"llama-?3(?:\.\d)?-?(8|70)b", "llama3-{0}b"),
    (r"qwen-?2\.5-?(0\.5|1\.5|3|7|14|32|72)b", "qwen2.5-{0}b"),
]


def _shape_by_name(name: str) -> ModelShape | None:
    import re

    lowered = name.lower().replace("_", "-")
    for pattern, short in _NAME_PATTERNS:
        found = re.search(pattern, lowered)
        if found and short.format(*found.groups()) in MODELS:
            return MODELS[short.format(*found.groups())]
    return None


def resolve_model(spec: str, role: str = "model", init: str | None = None) -> ModelShape:
    """The shape of `spec`: a local directory with config.json, a catalog hub id, or a short name.

    `init` is the recipe's `model.init` (e.g. `tiny`): the shape of the model `hflow train` would
    build at `spec` when the directory does not exist yet.
    """
    local = Path(spec).expanduser()
    if (local / "config.json").is_file():
        return shape_from_config(local / "config.json")
    shape = MODELS.get(spec.lower()) or MODELS.get(spec.rstrip("/").lower())
    if shape is not None:
        return shape
    if init is not None and init.lower() in MODELS:
        return MODELS[init.lower()]
    named = _shape_by_name(local.name or spec)
    if named is not None:
        return named
    where = "a directory without config.json" if local.is_dir() else "not a local model directory"
    raise UserError(
        f"{role} model {spec!r} is {where} and not in the mapper's catalog; point it at a directory "
        f"with a config.json, or use a known model ({', '.join(catalog_names())})"
    )
