"""The RL algorithms as single-controller programs, one file each, and the registry naming them."""
