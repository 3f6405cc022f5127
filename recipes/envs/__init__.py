"""Environments of the shipped multi-turn recipes (`rollout.env`)."""
