"""hflow from Python: `train`, `evaluate` and the `Run` they leave. The CLI is a shell over the same
steps (`launch.py`). Published as `hflow.train`, `hflow.evaluate`, `hflow.Run`."""
