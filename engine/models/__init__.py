"""Models: loading causal LMs and tokenizers, score (reward/value) models, tiny and GGUF-imported models."""
