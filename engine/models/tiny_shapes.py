"""The shapes of the Llama models hflow builds locally (`hflow init-model tiny|small|medium|base`,
`model.init`): no download, a character or small BPE tokenizer. Torch-free, so that the CLI can
name them without loading torch."""

TINY_SHAPES = {
    # name: (hidden, layers, heads, intermediate)
    "tiny": (64, 2, 2, 192),  # 0.1M parameters; head_dim 32, the smallest vLLM's CPU attention runs
    "small": (256, 4, 8, 768),  # 3.4M
    "medium": (512, 8, 8, 1536),  # 27M
    "base": (768, 12, 12, 3072),  # 85M: the ~100M-parameter scale of `hflow bench`
}
