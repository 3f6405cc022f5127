"""Rows on the move: a step streamed chunk by chunk between stages, rollouts produced ahead of
training within a staleness bound (async mode), and updates that start before a step is generated."""
