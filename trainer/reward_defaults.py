"""The built-in reward functions' names and their settings' defaults, in one place below both
readers: the recipe's `reward` section (`config/sections.py`) accepts these names and declares these
defaults, and `data/rewards.py` maps each name to its function and falls back to the defaults
when called without that section. This module imports nothing, so the schema does not import the
data layer above it."""

BUILTIN_NAMES = ("synthetic", "exact_match", "format", "length", "synthetic_cost", "env")
"""Accepted by `reward.function` and `cost.function` beside `module:function`; `data/rewards.py:
BUILTINS` holds exactly these."""

FORMAT_PATTERN = r"#### -?[\d,.]+\s*$"  # a GSM8K-style final answer at the end of the response
TARGET_LENGTH = 64  # characters
