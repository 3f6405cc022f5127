"""The run's lifecycle around an algorithm's loop: the checks before it starts, the session that
drives its steps (stages, metrics, checkpoints, the end), evaluation, and what a bad step does."""
