"""The controller's machinery around an algorithm's loop: the session, placement of worker groups, evaluation, benchmarks."""
