"""What a step's work is: the FLOPs and bytes each phase needs, what it computed, and the
efficiency account `hflow bench step` prints."""
