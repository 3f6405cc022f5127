"""Log-probs and entropies of chosen tokens from vocabulary-sized logits, in bounded memory.

The straightforward `log_softmax(logits.float() / T).gather(...)` makes several float32 copies
of every (row, position, vocab) logit at once (the cast, the division, the log-softmax, and
`exp` for the entropy), each kept alive until the end; with Qwen2.5's 151,936-token vocabulary
one copy of 32 rows x 512 positions is 10 GB. Here the tokens are taken a chunk at a time, so
only one chunk's float32 temporaries exist at once, and the backward pass recomputes the
softmax per chunk from the logits instead of keeping float32 copies for it (the logits are
kept, as the LM head's output already is). The arithmetic, with s = logits / T:

  log p_j = s_j - logsumexp(s)
  H       = -sum_j p_j log p_j
  d log p_y / d logit_j = (1[j = y] - p_j) / T
  d H / d logit_j       = -p_j (s_j - E_p[s]) / T = -p_j (log p_j + H) / T
"""

from __future__ import annotations

import torch

# Float32 values in one chunk's temporary. On a GPU 64 MiB (~110 tokens of Qwen2.5's vocabulary):
# few kernels a chunk. On the CPU 8 MiB: under glibc's largest mmap threshold (32 MiB), so a chunk's
# temporaries come from the heap, not fresh mappings faulted page by page, and nearer the cache
# (the update 13% faster on SmolLM2-135M: docs/benchmarks.md, "Host memory").
CHUNK_VALUES = 1 << 24
CPU_CHUNK_VALUES = 1 << 21


def token_log_probs(logits: torch.Tensor, where: tuple[torch.Tensor, ...], tokens: torch.Tensor,
                    temperature: float, with_entropy: bool = False,
                    chunk_values: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) at `logits[where]` of `tokens`, under softmax(logits / temperature).

    logits: (*lead, V) in any float dtype; where: one index tensor per leading dim, all of one
    shape S (advanced indexing: `logits[where]` is (*S, V), but is never built whole), or ()
    for logits (K, V) whose every row is scored (the head ran only where needed: `lm_head.head_at`),
    or (rows,) for logits (K, V) some of whose rows are scored twice or not at all;
    tokens: (*S) token ids. Returns float32 (*S) log-probs and (*S) entropy, or None.
    Gradients flow to `logits` (an index met twice gets both gradients).
    """
    shape = tokens.shape
    flat = tuple(w.reshape(-1) for w in where)
    default = CPU_CHUNK_VALUES if logits.device.type == "cpu" else CHUNK_VALUES
    chunk = max(1, (chunk_values or default) // logits.shape[-1])
    log_probs, entropy = _TokenLogProbs.apply(logits, tokens.reshape(-1), temperature, with_entropy, chunk, *flat)
    return log_probs.view(shape), entropy.view(shape) if with_entropy else None


def _at(where: tuple[torch.Tensor, ...], part: slice) -> tuple:
    """The chunk `part` of the scored positions: of each index tensor, or of the rows themselves."""
    return tuple(w[part] for w in where) if where else (part,)


def _scaled(logits: torch.Tensor, at: tuple, temperature: float) -> torch.Tensor:
    """(c, V) float32 logits / T at `at`: a fresh tensor (advanced indexing copies; a slice of
    rows is copied here), so it may be changed in place; no division at T = 1."""
    z = logits[at]
    z = z.float() if isinstance(at[0], torch.Tensor) else z.to(torch.float32, copy=True)
    return z if temperature == 1.0 else z.div_(temperature)


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, tokens, temperature, with_entropy, chunk, *where):
        lse = logits.new_empty(tokens.shape, dtype=torch.float32)
        log_probs = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if with_entropy else lse.new_empty(0)
        for start in range(0, len(tokens), chunk):
            part = slice(start, start + chunk)
            z = _scaled(logits, _at(where, part), temperature)
            lse[part] = torch.logsumexp(z, -1)
            log_p = z.sub_(lse[part, None])  # -sum p log p, not logsumexp - sum p s: no cancellation
            log_probs[part] = log_p.gather(-1, tokens[part, None]).squeeze(-1)
            if with_entropy:
                entropy[part] = log_p.exp().mul_(log_p).sum(-1).neg_()
        ctx.save_for_backward(logits, tokens, lse, entropy, *where)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        logits, tokens, lse, entropy, *where = ctx.saved_tensors
        grad, once = _gradient_for(logits, where)
        if grad_entropy is None or not entropy.numel():
            grad_entropy = None
        for start in range(0, len(tokens), ctx.chunk):
            part = slice(start, start + ctx.chunk)
            at = _at(where, part)
            log_p = _scaled(logits, at, ctx.temperature).sub_(lse[part, None])
            p = log_p.exp()
            # In place where possible: two chunk-sized float32 tensors at once. s - E_p[s] is
            # log p + H (both shifted by logsumexp).
            from_entropy = None if grad_entropy is None else log_p.add_(entropy[part, None]).mul_(p).mul_(
                grad_entropy[part, None])
            if grad_log_probs is None:
                g = p.zero_()
            else:
                g = p.mul_(grad_log_probs[part, None].neg())
                g.scatter_add_(-1, tokens[part, None], grad_log_probs[part, None])
            if from_entropy is not None:
                g.sub_(from_entropy)
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            if once is not None:
                _put_rows(grad, at[0], g.to(grad.dtype), once)
            elif where:
                grad.index_put_(at, g.to(grad.dtype), accumulate=True)
            else:
                grad[part] = g
        return (grad, None, None, None, None, *[None] * len(where))


def _gradient_for(logits: torch.Tensor, where: list) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The logits' gradient, to be filled chunk by chunk, and for scored rows given as one index
    (`where` = (rows,) into (N, V) logits: a shared prompt's last logits scored once per sample,
    then the rest once each) which rows are scored exactly once. Those are written, the others
    zeroed and added into: no zeroed copy of every logit (N x V) for a few repeated rows."""
    if not where:
        return torch.empty_like(logits), None  # every row written once, in order
    if len(where) > 1 or logits.dim() != 2:
        return torch.zeros_like(logits), None
    once = torch.bincount(where[0], minlength=len(logits)) == 1
    grad = torch.empty_like(logits)
    grad[~once] = 0
    return grad, once


def _put_rows(grad: torch.Tensor, rows: torch.Tensor, g: torch.Tensor, once: torch.Tensor) -> None:
    """A chunk's gradient rows into `grad`: written where the row is scored once, else added (by an
    accumulating `index_put_`, which a GPU adds in a fixed order; its `index_add_` would not)."""
    single = once[rows]
    if bool(single.all()):
        grad.index_copy_(0, rows, g)
        return
    grad.index_copy_(0, rows[single], g[single])
    grad.index_put_((rows[~single],), g[~single], accumulate=True)
