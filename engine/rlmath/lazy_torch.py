"""torch for the math modules whose names the recipe's schema reads, imported when one of their
functions first computes.

The schema accepts exactly the registered names (`aggregation`, `kl`, `off_policy`,
`policy_losses`), and `hflow validate`, `train` and `map` answer a recipe mistake before torch
loads (0.4 s instead of 3.5 s; `tests/cli/test_startup.py`). So those modules reach torch through
this stand-in: importing them registers their names, and torch loads at the first call that
computes (by then a run has loaded it anyway).
"""

from __future__ import annotations

import importlib


class _Torch:
    """Every attribute is torch's own, torch imported on the first one asked for; each attribute
    is kept once read, so later reads are plain lookups."""

    def __getattr__(self, name: str):
        value = getattr(importlib.import_module("torch"), name)
        setattr(self, name, value)
        return value


torch = _Torch()
