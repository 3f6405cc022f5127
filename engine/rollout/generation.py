"""The `hf` generation engine: batched sampling with a KV cache on a transformers model.

It runs on the actor's own module (no copy of the weights): the n samples of a prompt
share one prefill (the prompt's KV cache is repeated n times, or, decoding long prompts on a CPU,
read once for all n: `decode_cache.py`), finished sequences leave
the decoding batch (a quarter of it at a time) so they stop costing compute, and the
per-token log-probs of the sampled tokens come out of generation.

Output rows are grouped by prompt: prompt 0's n samples, then prompt 1's, and so on.
Shapes (N = prompts x n, P = longest prompt, R = longest response):
  input_ids, attention_mask, position_ids   (N, P + R)  prompt left-padded, response right-padded
  responses, response_mask, rollout_log_probs, rollout_entropy (N, R)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hflow.engine import work_meter
from hflow.engine.kernels import sampling
from hflow.engine.rollout.assembly import assemble_rollout
from hflow.engine.rollout.fast_decode import FastDecoder, supports
from hflow.engine.rollout.prefill import prefill


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    # Sequences the hf engine decodes together (whole prompt groups); None: the generator's own
    # (rollout.batch_size). vLLM batches as it schedules.
    batch_size: int | None = None

    @property
    def filtered(self) -> bool:
        """Whether draws come from a top-k / top-p part of the distribution (`filter_logits`)."""
        return self.top_k > 0 or self.top_p < 1.0


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask all but the top-k tokens and the smallest set holding top_p of the mass."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (the first always stays).
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class UniformDraws:
    """Sampling by inverting the cumulative distribution, with one uniform number per (step, row)
    drawn at the start of a generation, on the generator's device (no copy of the logits to the
    CPU), so that a row's draws do not depend on which other rows are still in the batch.

    One number per token instead of one per vocabulary entry (the Gumbel-max trick's noise): on a
    CPU, at 32 rows of SmolLM2's 49,152 tokens, the Gumbel noise's draws and two logarithms took
    12-17 ms a step (7% of the generation), the cumulative sum and search 1.4 ms, and
    `torch.multinomial` on the same probabilities 43-48 ms (docs/benchmarks.md). On a CPU, plain
    sampling (no top-k, top-p or greedy) from float32 logits draws by the same rule in a compiled
    kernel (`kernels/sampling.py`, through `drawn`), with the log-probs and entropy in the same passes.
    """

    def __init__(self, rows: int, steps: int, generator: torch.Generator | None, device: torch.device):
        source = generator.device if generator is not None else device
        self.values = torch.rand((steps, rows), generator=generator, device=source).to(device)

    def sample(self, probs: torch.Tensor, step: int, rows: torch.Tensor | None) -> torch.Tensor:
        """A token per row of `probs` (B, vocab; zeros for masked tokens, rows need not sum to 1)
        for this step's draws of these output rows (None: all rows): the first token whose
        cumulative probability reaches (1 - u) x the row's total. The target lies in (0, total],
        so a token of probability zero is never the first to reach it.

        A CPU's float32 cumulative sum accumulates in double (only each stored value is rounded);
        elsewhere it is taken in float64."""
        u = self.values[step] if rows is None else self.values[step][rows]
        cdf = probs.cumsum(-1, dtype=None if probs.device.type == "cpu" else torch.float64)
        target = (1.0 - u.to(cdf.dtype))[:, None] * cdf[:, -1:]
        return torch.searchsorted(cdf, target).squeeze(-1)


def drawn(logits: torch.Tensor, step: int, params: SamplingParams, draws: UniformDraws | None,
          rows: torch.Tensor | None, fused=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This step's token for each row of `logits` (B, vocab), its log-prob and the row's entropy,
    both under softmax(logits / T) (what the trainer scores); the token the argmax (greedy) or a
    draw (`draws`, at output rows `rows`) from that distribution, or from its top-k / top-p part.
    `fused`, the sampling kernel (`kernels/sampling.py`), draws plain samples from float32 logits."""
    if fused is not None and logits.dtype == torch.float32:
        u = draws.values[step] if rows is None else draws.values[step][rows]
        return fused(logits.contiguous(), u, params.temperature)
    scaled = logits / params.temperature if params.temperature != 1.0 else logits
    log_dist = F.log_softmax(scaled, -1)
    probs = log_dist.exp()
    entropy = -(probs * log_dist).sum(-1)
    if params.greedy:
        chosen = scaled.argmax(-1)
    else:
        pool = filter_logits(scaled, params.top_k, params.top_p).softmax(-1) if params.filtered else probs
        chosen = draws.sample(pool, step, rows)
    return chosen, log_dist.gather(-1, chosen[:, None]).squeeze(-1), entropy


def kept_in_place(leaving: torch.Tensor) -> torch.Tensor:
    """The rows of a (B,) `leaving` mask that stay, in the batch slots they take once the others
    leave: a row already among the first (staying count) slots keeps its slot, and the rows
    beyond fill the holes. A decoder then moves only those rows."""
    keep = (~leaving).nonzero().squeeze(-1)
    order = torch.arange(len(keep), device=leaving.device)
    order[leaving[:len(keep)].nonzero().squeeze(-1)] = keep[keep >= len(keep)]
    return order


def last_finished(finished: torch.Tensor, count: int) -> torch.Tensor:
    """(B,) mask of the `count` finished rows in the highest slots (the fewest rows then move)."""
    slots = finished.nonzero().squeeze(-1)
    return torch.zeros_like(finished).index_fill_(0, slots[len(slots) - count:], True)


class ForwardDecoder:
    """Decoding through the model's own forward and transformers' cache (any architecture,
    and ZeRO-3, whose gathering hooks run inside the forward)."""

    def __init__(self, model, cache, mask: torch.Tensor):
        self.model, self.cache, self.mask = model, cache, mask

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]

    @staticmethod
    def batch_rows(live: int, batch: int) -> int:
        """Rows to keep decoding: all until the finished ones are a quarter of the batch (each drop
        copies the whole cache), then only the live ones."""
        return live if (batch - live) * 4 >= batch else batch

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask,
                         position_ids=self.mask.sum(-1, keepdim=True) - 1, past_key_values=self.cache,
                         use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1].float()


class GenerationCancelled(Exception):
    """A generation stopped between two tokens because its `cancel` event was set."""


class HFGenerator:
    """Finished rows leave the decoding batch as their decoder says (`batch_rows`): the lean step
    (`fast_decode.FastDecoder`) keeps the batch at a row count its products run fast at (it moves
    only the rows that fill the holes), the plain forward drops them once they are a quarter of
    the batch (transformers' cache copies every row). Rows kept after they finished are fed
    padding. Nothing in a generation is collective: under ZeRO-3 the
    actor generates on whole weights gathered once (`gathered_generator.py`), so each rank stops
    when its own rows are done."""

    def __init__(self, model, eos_token_ids: list[int], pad_token_id: int, batch_size: int,
                 fast: bool = True):
        self.model = model
        work_meter.attach(model, "actor")  # the policy's generation work (a model already metered keeps its meter)
        self.fast = fast and supports(model)  # the lean decoding step (fast_decode.py) where it applies
        self.eos = torch.tensor(sorted(set(eos_token_ids)))
        self.pad = pad_token_id
        self.batch_size = batch_size
        # Set from another thread to stop a generation at its next token (the async generator's
        # way to end with the run: `generator_copy.py`); None: never cancelled.
        self.cancel = None

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        was_training = self.model.training
        self.model.eval()
        try:
            per_chunk = max(1, (params.batch_size or self.batch_size) // n)
            parts = [
                self._generate_chunk(prompts[i:i + per_chunk], n, params, generator)
                for i in range(0, len(prompts), per_chunk)
            ]
        finally:
            self.model.train(was_training)
        return self._assemble(parts)

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _generate_chunk(self, prompts, n, params: SamplingParams, generator):
        device = self._device()
        # One prefill per prompt, shared by its n samples, the prompts' common prefix run once
        # (`prefill.py`); the LM head on each prompt's last position only.
        logits, cache, mask, prefix = prefill(self.model, prompts, self.pad, device)
        logits = logits.repeat_interleave(n, 0)
        if self.fast:  # the prompts' keys repeated to their n samples, or shared by them (`decode_cache.py`)
            decoder = FastDecoder(self.model, cache, mask, params.max_new_tokens, repeat=n, prefix=prefix)
        else:
            cache.batch_repeat_interleave(n)
            decoder = ForwardDecoder(self.model, cache, mask.repeat_interleave(n, 0))
        rows = len(prompts) * n
        active = torch.arange(rows, device=device)  # the output row of each batch slot
        finished = None  # (batch,) bool once some rows in the batch have ended, else None
        eos = self.eos.to(device)
        record = []  # per step: (active, live or None, token, log-prob, entropy)
        draws = None if params.greedy else UniformDraws(rows, params.max_new_tokens, generator, device)
        compacted = False  # whether rows have left the batch (`active` is no longer every row)
        # Plain sampling on a CPU: one compiled pass per row (`kernels/sampling.c`), where it builds.
        fused = sampling.available() if device.type == "cpu" and not (params.greedy or params.filtered) else None
        for t in range(params.max_new_tokens):
            self._raise_if_cancelled(t)
            chosen, logp, entropy = drawn(logits, t, params, draws, active if compacted else None, fused)
            if finished is not None:  # (their log-probs and entropies are not kept: `record`'s mask)
                chosen = chosen.masked_fill(finished, self.pad)
            record.append((active, None if finished is None else ~finished, chosen, logp, entropy))
            done = torch.isin(chosen, eos)
            if finished is not None:
                done |= finished
            ended = int(done.sum())
            if t + 1 == params.max_new_tokens or ended == len(done):
                break
            finished = done if ended else None
            leave = 0 if finished is None else len(done) - decoder.batch_rows(len(done) - ended, len(done))
            if leave:
                # Finished sequences leave the batch: their cache rows are dropped.
                keep = kept_in_place(last_finished(finished, leave))
                decoder.select(keep)
                active, chosen, compacted = active[keep], chosen[keep], True
                finished = finished[keep] if leave < ended else None
            logits = decoder.step(chosen)
        return self._collect(prompts, n, rows, params.max_new_tokens, record)

    def _raise_if_cancelled(self, token: int) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise GenerationCancelled(f"generation cancelled at token {token}")

    def _collect(self, prompts, n, rows: int, max_new: int, record):
        """The recorded steps as (rows, max_new) tokens, log-probs and entropies, written at once."""
        live = torch.cat([step[1] if step[1] is not None else torch.ones_like(step[0], dtype=torch.bool)
                          for step in record])
        index_cols = torch.cat([torch.full_like(step[0], t) for t, step in enumerate(record)])[live].cpu()
        index_rows, chosen, logp, entropy = (torch.cat([step[k] for step in record])[live].cpu() for k in (0, 2, 3, 4))
        tokens = torch.full((rows, max_new), self.pad, dtype=torch.long)
        logps = torch.zeros(rows, max_new)
        entropies = torch.zeros(rows, max_new)
        tokens[index_rows, index_cols] = chosen
        logps[index_rows, index_cols] = logp
        entropies[index_rows, index_cols] = entropy
        lengths = torch.zeros(rows, dtype=torch.long).scatter_reduce_(0, index_rows, index_cols + 1, "amax")
        return [p for p in prompts for _ in range(n)], tokens, logps, lengths, entropies

    def _assemble(self, parts) -> dict[str, torch.Tensor]:
        prompts = [p for part in parts for p in part[0]]
        tokens, logps, lengths, entropies = (torch.cat([part[k] for part in parts]) for k in (1, 2, 3, 4))
        return assemble_rollout(prompts, tokens, lengths, self.pad, rollout_log_probs=logps,
                                rollout_entropy=entropies)
