"""The run directory: its layout, the writer the trainer uses, and the readers of the monitor and CLI."""
