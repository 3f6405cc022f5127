"""Generation: the hf and vLLM engines, the rollout they return, and the train <-> rollout switch with its weight sync."""
