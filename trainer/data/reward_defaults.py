"""Defaults of the built-in reward functions' settings, in one place: the recipe's `reward`
section declares them as its defaults, and `rewards.load_reward_fn` falls back to them when
called without that section (this module imports nothing, so neither imports the other)."""

FORMAT_PATTERN = r"#### -?[\d,.]+\s*$"  # a GSM8K-style final answer at the end of the response
TARGET_LENGTH = 64  # characters
