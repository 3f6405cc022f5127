"""Where a run's events go besides the run directory: the console progress and Weights & Biases."""
