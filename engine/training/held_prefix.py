"""The keys and values of a prefix every prompt of a pass begins with, held for the pass's packed
micro-batches (`packed.py`) so that they attend to it without running it again: without gradients
(scoring, `logprobs.batched_log_probs`) and with them (an update's micro-batches,
`logprobs.trained_prefix`), where the prefix's backward runs once, inside the last micro-batch's.
"""

from __future__ import annotations

import torch


class HeldPrefix:
    """The keys and values of the prefix every prompt of a scoring call begins with (`ids`), per
    layer, for the call's packed micro-batches to attend to without running the prefix again. Its
    keys come after the rotary embedding at positions 0, 1, ..., the same in every forward.

    Without gradients the call's first packed forward runs the prefix and keeps them (`keep`).
    With them (`uses`: the number of packed forwards that will attend to it, an update's micro-
    batches, each with its own backward) the prefix runs alone first (`packed.run_prefix_alone`),
    its graph kept; the forwards before the last attend to detached copies, whose gradients their
    backwards gather, and the last attends to the graph itself, handing it those gradients with its own
    (`_HeldGradients`): one forward and one backward of the prefix for them all, inside the last
    micro-batch's backward (DeepSpeed reduces gradients there). `flowed` says that it happened."""

    def __init__(self, ids: torch.Tensor, uses: int | None = None):
        if uses is not None and uses < 1:
            raise ValueError(f"a held prefix with gradients needs at least one forward to attend to it, not {uses}")
        self.ids = ids  # (P,)
        self.uses_left, self.flowed = uses, False
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.graph: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def kept(self) -> bool:
        return bool(self.layers)

    @property
    def trains(self) -> bool:
        return self.uses_left is not None

    def keep(self, layer, key: torch.Tensor, value: torch.Tensor) -> None:
        if layer is None:
            raise ValueError("a held prefix needs each attention module's layer_idx")
        if self.trains:
            self.graph[layer] = key, value
            self.layers[layer] = key.detach().requires_grad_(), value.detach().requires_grad_()
        else:
            self.layers[layer] = key.detach(), value.detach()

    def begin_use(self) -> None:
        """A packed forward with gradients is about to attend to the prefix: the last of `uses` attends
        to its graph (`of`)."""
        if self.uses_left < 1:
            raise ValueError("a held prefix with gradients was attended to more often than its uses")
        self.uses_left -= 1

    def of(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix's keys and values (1, kv_heads, P, d) in `layer`."""
        if layer not in self.layers:
            raise ValueError(f"the held prefix has no keys for layer {layer}: its first forward did not run it")
        if self.trains and self.uses_left == 0:
            return tuple(_HeldGradients.apply(graph, self, leaf) for graph, leaf in zip(self.graph[layer],
                                                                                       self.layers[layer]))
        return self.layers[layer]

    def begins(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> bool:
        """Whether every left-padded prompt (G, P) begins with `ids` and has a token of its own after them."""
        lengths = prompt_mask.sum(-1)
        if bool((lengths <= self.length).any()):
            return False
        starts = (prompt_mask.shape[1] - lengths)[:, None] + torch.arange(self.length, device=prompt_ids.device)
        return bool((prompt_ids.gather(1, starts) == self.ids.to(prompt_ids.device)[None]).all())


class _HeldGradients(torch.autograd.Function):
    """The held prefix's keys (or values) as the last forward attends to them: their graph, whose
    gradient in the backward is this forward's own plus what the earlier forwards gathered in the
    detached copy `leaf`."""

    @staticmethod
    def forward(ctx, graph, held, leaf):
        ctx.held, ctx.leaf = held, leaf
        return graph.view_as(graph)

    @staticmethod
    def backward(ctx, grad):
        ctx.held.flowed = True
        gathered = ctx.leaf.grad
        return (grad if gathered is None else grad + gathered), None, None
