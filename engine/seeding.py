"""Named random streams: every random draw is a function of (seed, purpose, step, ...).

Deriving each stream from the step instead of carrying RNG state makes a resumed
run draw exactly what an uninterrupted run draws, with nothing to save.
"""

from __future__ import annotations

import hashlib

import torch


def stream_seed(seed: int, purpose: str, *ids: int) -> int:
    """A 63-bit seed for one purpose ('rollout', 'data', ...) at one step/rank."""
    text = ":".join([str(seed), purpose, *map(str, ids)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def seed_update(seed: int, purpose: str, *ids: int) -> None:
    """Seed torch's global generators (CPU and CUDA: what dropout draws from, e.g. LoRA's) from the
    stream before an update, so that a resumed run draws the same dropout masks. Generation and
    data use their own generators; nothing else in a worker draws from the global ones."""
    torch.manual_seed(stream_seed(seed, purpose, *ids))
