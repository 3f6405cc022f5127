"""Building tiny models locally and loading model directories, offline and safely.

`build_tiny_model` makes a small Llama-architecture causal LM and a character-level
tokenizer from a fixed seed, with no download: the quickstart and the tests use it.
`load_causal_lm` / `load_tokenizer` read a local Hugging Face directory (or a hub id
the local cache or the hub can serve), with `trust_remote_code` off unless asked.
"""

from __future__ import annotations

import functools
import string
from pathlib import Path
from types import SimpleNamespace

import torch

from hflow.engine.kernels.product_route import route_linears
from hflow.engine.models.folder import check_model_source
from hflow.engine.models.fused_layers import fuse_layers
from hflow.engine.models.tiny_shapes import TINY_SHAPES
from hflow.errors import UserError

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
# Characters of the tiny tokenizer: enough for the synthetic tasks and simple chat.
TINY_CHARS = string.ascii_lowercase + string.digits + " .,:;!?+-*=()'\"\n"
# A minimal chat template so that chat-message prompts work with the tiny tokenizer.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tiny_tokenizer():
    """A character-level fast tokenizer: one token per character, <pad>/<bos>/<eos> specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, *TINY_CHARS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Split into single characters, keeping every character (spaces and newlines too).
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=PAD
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(out_dir: str | Path, size: str = "tiny", seed: int = 0,
                     tie_word_embeddings: bool = False, tokenizer=None) -> Path:
    """Write a small Llama model and its tokenizer (default: the character one) to `out_dir`
    (safetensors, fixed seed)."""
    from transformers import LlamaForCausalLM

    out = Path(out_dir)
    tokenizer = tokenizer or build_tiny_tokenizer()
    config = tiny_config(tokenizer, size, tie_word_embeddings=tie_word_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_score_model(size: str = "tiny", seed: int = 0):
    """An untrained small Llama sequence classifier (one label) and the tiny tokenizer: the
    starting point of `hflow init-model tiny-reward` / `tiny-cost` (see `tiny_scorers.py`)."""
    from transformers import LlamaForSequenceClassification

    tokenizer = build_tiny_tokenizer()
    config = tiny_config(tokenizer, size, num_labels=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
    return model, tokenizer


def tiny_config(tokenizer, size: str = "tiny", **extra):
    from transformers import LlamaConfig

    if size not in TINY_SHAPES:
        raise UserError(f"model size {size!r} is not known; accepted: {', '.join(TINY_SHAPES)}")
    hidden, layers, heads, inter = TINY_SHAPES[size]
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **{"tie_word_embeddings": False, **extra},
    )


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """The model's tokenizer, left-padding, with a pad token. Loaded once per process: the
    controller and the workers colocated with it share one (nothing changes it after loading);
    a local directory that changed since is read again."""
    check_model_source(path, "tokenizer", model=False)
    folder = Path(path)
    stamp = folder.stat().st_mtime_ns if folder.is_dir() else None
    return _load_tokenizer(str(path), trust_remote_code, stamp)


@functools.lru_cache(maxsize=8)
def _load_tokenizer(path: str, trust_remote_code: bool, _stamp: int | None):
    from transformers import AutoTokenizer  # heavy: only commands that load a model pay for it

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype: torch.dtype, trust_remote_code: bool = False):
    """A causal LM from a local directory, in `dtype`, in eval-free training mode, its linear layers
    routed to the faster CPU products (`product_route.route_linears`), its norms and MLPs fused where
    they run in float32 on a CPU (`fused_layers.fuse_layers`)."""
    from transformers import AutoModelForCausalLM

    check_model_source(path, "model", tokenizer=False)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=None
        )
    except OSError as err:
        raise UserError(f"model '{path}': cannot load ({str(err).splitlines()[0]})") from None
    route_linears(model)
    fuse_layers(model)
    return model


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end a response: the model's generation config's, else the tokenizer's."""
    eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    return eos if isinstance(eos, list) else [eos]


def config_and_eos(path: str, tokenizer, trust_remote_code: bool = False):
    """A model folder's config and `eos_token_ids`, without loading its weights: the generation
    config as `from_pretrained` reads it (generation_config.json, else the model config's)."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    try:
        generation = GenerationConfig.from_pretrained(path)
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    return config, eos_token_ids(SimpleNamespace(generation_config=generation), tokenizer)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torch dtype of `model.dtype` on `device`. `auto` is bfloat16 on a GPU that computes in it
    natively (compute capability 8.0, Ampere, or newer) and float32 anywhere else.

    Older GPUs (V100: 7.0, T4: 7.5) have no bf16 units: vLLM refuses bfloat16 there ("Bfloat16
    is only supported on GPUs with compute capability of at least 8.0", vllm/platforms/cuda.py)
    and torch and DeepSpeed emulate it, far slower than float32. Their fast half type is float16,
    which hflow does not offer: its 5-bit exponent overflows without loss scaling (Micikevicius
    et al. 2018, arXiv 1710.03740) and RL's log-ratios and KL terms are where it would overflow
    first. So `auto` falls back to float32, and an explicit bfloat16 there is an error."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and gpu_has_bf16(device) else torch.float32
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]
    if dtype == torch.bfloat16 and device.type == "cuda" and not gpu_has_bf16(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise UserError(f"model.dtype is bfloat16, but this run's GPU, {torch.cuda.get_device_name(device)} "
                        f"(compute capability {major}.{minor}), has no native bfloat16 (it needs 8.0, Ampere, "
                        "or newer); use model.dtype: float32 (or auto, which picks float32 there)")
    return dtype


def gpu_has_bf16(device: torch.device) -> bool:
    """Whether the GPU `device` computes in bfloat16 natively: compute capability 8.0 or more, vLLM's
    own test (`check_if_supports_dtype` in vllm/platforms/cuda.py and rocm.py). Not
    `torch.cuda.is_bf16_supported()`: it answers for the current device, not this one, and by
    default says True where torch only emulates bf16."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX), from the
    flags in /proc/cpuinfo (or `cpuinfo`); None where that file does not exist.

    Without them torch emulates bf16 products: measured on an AVX2-only EPYC, 0.8 GFLOP/s
    against 91 in float32; on a CPU with AMX, 530 against 200 (docs/benchmarks.md)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})

