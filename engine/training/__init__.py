"""Training: the DeepSpeed ZeRO engine, the losses, log-probs, and packing of micro-batches."""
