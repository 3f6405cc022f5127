"""Ranks that must run the same forwards: ZeRO-3 over several data-parallel ranks.

Under ZeRO-3 each layer's parameters are sharded over the ranks, and every forward (and
backward) through a layer all-gathers them collectively (DeepSpeed's pre-forward hooks,
`runtime/zero/parameter_offload.py`). A rank that runs one forward more than another waits in
that all-gather until the collective timeout. So wherever a rank would choose how many
forwards to run from its own rows (micro-batch counts; scoring a shared prompt first, two
forwards, or whole rows, one), the ranks of such a group agree first (callers pass `zero3`).
"""

from __future__ import annotations

import torch


def agreed(value: int, op: str, device) -> int:
    """`value` reduced over the default process group: "min" or "max" (an all-reduce)."""
    import torch.distributed as dist

    reduce_op = {"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
    tensor = torch.tensor([int(value)], device=device)
    dist.all_reduce(tensor, op=reduce_op)
    return int(tensor)


def several_ranks() -> bool:
    """Whether this process is one of several ranks of the default process group."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
