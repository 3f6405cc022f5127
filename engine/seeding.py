"""Named random streams: every random draw is a function of (seed, purpose, step, ...).

Deriving each stream from the step instead of carrying RNG state makes a resumed
run draw exactly what an uninterrupted run draws, with nothing to save.
"""

from __future__ import annotations

import hashlib


def stream_seed(seed: int, purpose: str, *ids: int) -> int:
    """A 63-bit seed for one purpose ('rollout', 'data', ...) at one step/rank."""
    text = ":".join([str(seed), purpose, *map(str, ids)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1
