"""A decoding step's sampling as one compiled kernel (`sampling.c`): the token each row draws from
softmax(logits / T) at its uniform number (the inverse of the cumulative distribution, as
`rollout/generation.py`'s `UniformDraws` draws), its log-probability and the row's entropy, in
three passes over the row instead of eager torch's six and three vocabulary-sized tensors.

The same rule as torch's path; the exponentials differ in their last bits (about 1e-7 relative),
so the log-probabilities and entropies agree to about 1e-6, and a draw within that of the boundary
between two tokens may take the other one.
"""

from __future__ import annotations

import ctypes

import torch

from hflow.engine.kernels import build

_POINTER, _LONG, _INT = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


class Sampling:
    """The compiled kernel, called on torch tensors. `available()` gives one, or None where the
    kernel cannot be built here (`build.load`)."""

    def __init__(self, library: ctypes.CDLL):
        self.call = library.sample_rows
        self.call.restype = None
        self.call.argtypes = [_POINTER, _LONG, _LONG, _LONG, ctypes.c_float, _POINTER, _POINTER, _POINTER, _POINTER,
                              _INT]

    def __call__(self, logits: torch.Tensor, uniform: torch.Tensor,
                 temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, log-probs, entropies), each (rows,), of `logits` (rows, vocab) float32 on the CPU
        (rows contiguous) under softmax(logits / temperature), a row's token drawn at `uniform`
        (rows,) float32 in [0, 1)."""
        rows, vocab = logits.shape if logits.dim() == 2 else (-1, -1)
        if (logits.dtype != torch.float32 or not logits.is_cpu or logits.dim() != 2
                or logits.stride(1) != 1 or vocab < 1):
            raise ValueError(f"the sampling kernel takes float32 CPU logits (rows, vocab) whose rows are contiguous, "
                             f"not {logits.dtype} {tuple(logits.shape)}/{logits.stride()} on {logits.device}")
        uniform = uniform.to(torch.float32).contiguous()
        if uniform.shape != (rows,) or not temperature > 0:
            raise ValueError(f"the sampling kernel takes one uniform number per row ({rows}) and a positive "
                             f"temperature, not {tuple(uniform.shape)} and {temperature}")
        tokens = torch.empty(rows, dtype=torch.long)
        log_probs, entropy = torch.empty(rows), torch.empty(rows)
        if rows:
            self.call(logits.data_ptr(), rows, vocab, logits.stride(0), 1.0 / temperature, uniform.data_ptr(),
                      tokens.data_ptr(), log_probs.data_ptr(), entropy.data_ptr(), torch.get_num_threads())
        return tokens, log_probs, entropy


def available() -> Sampling | None:
    """The kernel, built and loaded once per process (`build.load`), or None where it cannot be."""
    return build.wrapped("sampling", Sampling)
