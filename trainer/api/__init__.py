"""hflow from Python: `train`, `evaluate`, `compare` and the `Run` they leave. The CLI is a shell over
the same steps (`launch.py`). Published as `hflow.train`, `hflow.evaluate`, `hflow.compare`, `hflow.Run`."""
