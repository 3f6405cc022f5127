"""The work a phase of the RL step NEEDS, and the FLOPs of work counted by the engine's meter.

Work is counted in the units of `engine/work_meter.py`: body tokens (positions through the
decoder), attention keys ((query, key) pairs of causal attention: the token at position p attends
to p + 1 keys) and head positions (the LM head's logits, or a score model's scalar head). What a
phase needs, from its rows' real tokens only (no padding):

  a prompt runs once for its group (the rows with one `uid`), and tokens that prompts begin
  with alike (a chat template's header, a system prompt) once for all of them (the prompts'
  trie: `prompt_prefix.already_begun`); a response of r tokens needs r - 1
  more positions (its last token predicts nothing), and r logits of which the first, at the last
  prompt position, its group shares: groups + sum(r - 1) in all. Generation needs exactly this
  (a prefill per prompt, then one decoding step per row per token but the last), and so does
  scoring the rollout (old log-probs, reference, a critic's values). A reward model reads the
  score after the last response token: the response's r positions, one head position per row.
  The update is a forward and a backward, 3x a forward (Kaplan et al. 2020, arXiv 2001.08361),
  per epoch; each optimizer step after an epoch's first runs again the tokens every prompt begins
  with (its rows begin with them whichever they are, and the weights are new).

FLOPs: 2 per weight of a matrix product per token (the mapper's `ModelShape`), attention
4 x layers x hidden per key (QK^T and AV, 2 x hidden each per layer), and 2 per head weight per
head position.

Bytes: a pass reads its weights at least once; generation is memory-bound (Pope et al. 2022,
arXiv 2211.05102): every decoding step of each decode batch reads the weights, and each row reads
its KV cache; the update's forward and backward read the weights once each per optimizer step,
and AdamW in fp32 reads param, grad, exp_avg and exp_avg_sq and writes param, exp_avg and
exp_avg_sq: 28 bytes per trained parameter per optimizer step.

Parts: work that must wait for the work before it (`Part`). Generation's decoding steps wait each
for the last one's token, and AdamW for the gradients, so a machine's least time for them is
each part's own least time added up, not the whole phase's FLOPs and bytes set against each
other: a step of 2 live rows reads the weights as a step of 32 does, with a sixteenth of the
FLOPs to hide the reads behind.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hflow.engine.prompt_prefix import already_begun, trie_size
from hflow.mapper.models import ModelShape

ADAMW_BYTES_PER_PARAM = 28  # 4 fp32 tensors read, 3 written
BACKWARD = 2  # a backward pass costs twice its forward
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Counts:
    """Work in the meter's units: body tokens, attention keys, head positions."""

    tokens: int = 0
    keys: int = 0
    logits: int = 0

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.tokens + other.tokens, self.keys + other.keys, self.logits + other.logits)


@dataclass(frozen=True)
class StepRows:
    """A step's rows as the needed work sees them (real tokens only): each row's prompt length,
    response length and prompt group (rows of one group share their prompt)."""

    prompt_lengths: torch.Tensor  # (N,) long
    response_lengths: torch.Tensor  # (N,) long
    groups: torch.Tensor  # (N,) long, group index of each row
    begun: torch.Tensor | None = None  # (N,) long: the first tokens of a row's prompt another group's ran
    rank: torch.Tensor | None = None  # (N,) long: its prompt's place among the groups' in sorted order

    def __len__(self) -> int:
        return len(self.groups)

    def group_prompts(self) -> torch.Tensor:
        """(G,) the prompt length of each group, in order of first appearance."""
        return self.prompt_lengths[_first_rows(self.groups)]

    def group_begun(self) -> torch.Tensor:
        """(G,) each group's prompt tokens that an earlier group's prompt needed already (0 without
        the prompts' tokens)."""
        first = _first_rows(self.groups)
        return torch.zeros_like(first) if self.begun is None else self.begun[first]

    def shared_by_all(self) -> int:
        """The first tokens every group's prompt begins with, short of the shortest prompt's last (one
        group: its prompt but the last token; 0 without the prompts' tokens)."""
        if self.begun is None or not len(self.groups):
            return 0
        after_first = self.group_begun()[self.rank[_first_rows(self.groups)] > 0]  # the first began nothing
        return max(0, min([int(self.prompt_lengths.min()) - 1, *after_first.tolist()]))


def _first_rows(groups: torch.Tensor) -> torch.Tensor:
    """(G,) the first row of each group, in row order."""
    values, inverse = torch.unique(groups, return_inverse=True)
    first = torch.full((len(values),), len(groups), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(groups)), "amin")
    return first.sort().values


def step_rows(attention_mask: torch.Tensor, response_width: int, uids: list | None,
              input_ids: torch.Tensor | None = None) -> StepRows:
    """The rows of a rollout batch: attention_mask (N, P + R) with R = `response_width` (1 on real
    tokens: a multi-turn response's environment tokens count), and the rows' `uid`s, one per
    prompt group (None: each row its own group). With `input_ids` (N, P + R), rows whose prompts
    are the same tokens are one group whatever their uids: a data set may hold a prompt twice,
    and a prompt needs running once however many groups sample it."""
    mask = attention_mask.long()
    width_p = mask.shape[1] - response_width
    prompts, responses = mask[:, :width_p].sum(-1), mask[:, width_p:].sum(-1)
    if input_ids is not None:
        masked = torch.cat([input_ids[:, :width_p] * mask[:, :width_p], prompts[:, None]], 1)
        groups = torch.unique(masked, dim=0, return_inverse=True)[1]
        tokens = [row[m.bool()].tolist() for row, m in zip(input_ids[:, :width_p], mask[:, :width_p])]
        return StepRows(prompts, responses, groups, *row_tries(tokens, groups))
    if uids is None:
        groups = torch.arange(len(mask))
    else:
        index: dict = {}
        groups = torch.tensor([index.setdefault(u, len(index)) for u in uids], dtype=torch.long)
    return StepRows(prompts, responses, groups)


def row_tries(prompts: list[list[int]], groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(begun, rank) (N,) of each row's prompt group (`prompt_prefix.already_begun` over the groups'
    prompts): the first tokens another group's prompt begins with too, and its sorted place."""
    first = _first_rows(groups)
    begun, rank = (torch.tensor(t, dtype=torch.long) for t in already_begun([prompts[i] for i in first.tolist()]))
    _, inverse = torch.unique(groups, return_inverse=True)
    order = torch.empty_like(first)
    order[inverse[first]] = torch.arange(len(first))  # each group's index among the first rows
    return begun[order[inverse]], rank[order[inverse]]


def causal_sum(start: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Keys of `count` consecutive positions from `start`: sum of p + 1 for p in [start, start + count)."""
    return count * start + count * (count + 1) // 2


def scoring_counts(rows: StepRows) -> Counts:
    """One pass that scores every response token (log-probs, values), or generates them:
    each group's prompt once, then r - 1 positions per row."""
    prompts, begun = rows.group_prompts(), rows.group_begun()
    steps = (rows.response_lengths - 1).clamp(min=0)
    keys = causal_sum(begun, prompts - begun).sum() + causal_sum(rows.prompt_lengths, steps).sum()
    return Counts(int((prompts - begun).sum() + steps.sum()), int(keys), int(len(prompts) + steps.sum()))


def reward_counts(rows: StepRows) -> Counts:
    """A reward model's pass: each group's prompt once, every response token, one score per row."""
    prompts, begun = rows.group_prompts(), rows.group_begun()
    r = rows.response_lengths
    keys = causal_sum(begun, prompts - begun).sum() + causal_sum(rows.prompt_lengths, r).sum()
    return Counts(int((prompts - begun).sum() + r.sum()), int(keys), len(rows))


def head_params(shape: ModelShape, lm_head: bool) -> int:
    """Weights of the head: the LM head (vocab x hidden), or a score model's (hidden x 1)."""
    return shape.vocab * shape.hidden if lm_head else shape.hidden


def forward_flops(shape: ModelShape, lm_head: bool, work: Counts) -> float:
    """FLOPs of a forward that did `work`."""
    body = shape.matmul_params(lm_head) - head_params(shape, lm_head)
    return (2.0 * body * work.tokens + 4.0 * shape.layers * shape.hidden * work.keys
            + 2.0 * head_params(shape, lm_head) * work.logits)


def computed_flops(shape: ModelShape, lm_head: bool, counted: dict[str, int]) -> float:
    """FLOPs of a meter's counts ({tokens, keys, logits, backward_tokens, ...}): forward + 2x backward."""
    forward = Counts(counted.get("tokens", 0), counted.get("keys", 0), counted.get("logits", 0))
    backward = Counts(counted.get("backward_tokens", 0), counted.get("backward_keys", 0),
                      counted.get("backward_logits", 0))
    return forward_flops(shape, lm_head, forward) + BACKWARD * forward_flops(shape, lm_head, backward)


def weights_bytes(shape: ModelShape, lm_head: bool, dtype_bytes: int) -> float:
    return float(shape.params(lm_head) * dtype_bytes)


@dataclass(frozen=True)
class Part:
    """Work of a phase that cannot start before the part before it has ended (a decoding step
    needs the last step's token; AdamW, the gradients): its FLOPs and bytes, and `passes`, how
    many times one after another its bytes are read (a decoding step each). Between two passes a
    device can keep at most its caches' worth of them (`bench_account.cache_bytes`), so each
    pass reads the rest from memory again."""

    flops: float
    nbytes: float
    passes: int = 1


def whole(parts: dict[str, Part]) -> tuple[float, float]:
    """(FLOPs, bytes) of all the parts."""
    return sum(p.flops for p in parts.values()), sum(p.nbytes for p in parts.values())


def generation_parts(shape: ModelShape, rows: StepRows, batch_rows: int, dtype_bytes: int) -> dict[str, Part]:
    """Generation's work as the parts that run one after another: "prefill" (each prompt once for
    its group, what it begins with alike with another prompt once for both, the weights read once
    per decode batch of `batch_rows` consecutive rows), then the
    decoding steps grouped by how many rows are still decoding, "decode_<k>" for k to 2k - 1 rows
    (in the order they run: the most rows first).
    A decoding step reads the weights, a prompt's KV cache once for its group (its samples can read
    it together, as the hf engine does with long prompts: `engine/rollout/decode_cache.py`) and
    each live row's own tokens'; its FLOPs are its live rows' (a row of response r decodes r - 1
    steps). The parts add up to `scoring_counts`' FLOPs and `generation_bytes`."""
    prompts, begun = rows.group_prompts(), rows.group_begun()
    begun_rows = torch.zeros_like(rows.groups) if rows.begun is None else rows.begun
    rank_rows = rows.groups if rows.rank is None else rows.rank  # (without: no two prompts begin alike)
    batches = list(zip(*(t.split(max(1, batch_rows)) for t in ((rows.response_lengths - 1).clamp(min=0),
                                                               rows.prompt_lengths, rows.groups, begun_rows,
                                                               rank_rows))))
    prefill = Counts(int((prompts - begun).sum()), int(causal_sum(begun, prompts - begun).sum()), len(prompts))
    weights = weights_bytes(shape, True, dtype_bytes)
    decoding = add_parts([_decoding(shape, *batch, weights, dtype_bytes) for batch in batches if batch[0].max() > 0])
    return {"prefill": Part(forward_flops(shape, True, prefill), len(batches) * weights, len(batches)),
            **{f"decode_{k}": decoding[k] for k in sorted(decoding, reverse=True)}}


def _decoding(shape: ModelShape, steps: torch.Tensor, prompt: torch.Tensor, groups: torch.Tensor,
              begun: torch.Tensor, rank: torch.Tensor, weights: float, dtype_bytes: int) -> dict[int, Part]:
    """One decode batch's decoding steps (each row's `steps`, prompt length, group, and its prompt's
    `begun` and `rank` among the step's: `row_tries`) by live rows: {k: the steps with k to 2k - 1
    live rows}. A step reads the running groups' prompts, each distinct prefix of them once (the
    nodes of their trie: a prefix every prompt begins with, once for all)."""
    span = int(steps.max())
    _, inverse = torch.unique(groups, return_inverse=True)
    group_steps = torch.zeros(int(inverse.max()) + 1, dtype=torch.long).scatter_reduce(0, inverse, steps, "amax")
    group_prompt, group_begun, group_rank = (torch.zeros_like(group_steps).scatter_reduce(0, inverse, t, "amax")
                                             for t in (prompt, begun, rank))
    live = _still_running(steps, torch.ones_like(steps), span)
    own = live * torch.arange(1, span + 1)  # each live row's own tokens, the step's included
    step_flops = forward_flops(shape, True, Counts(live, _still_running(steps, prompt, span) + own, live))
    step_bytes = weights + (_prompt_columns(group_steps, group_prompt, group_begun, group_rank, span) + own) \
        * shape.kv_bytes_per_token(dtype_bytes)
    bucket = 2 ** torch.floor(torch.log2(live.double())).long()
    return {k: Part(float(step_flops[bucket == k].sum()), float(step_bytes[bucket == k].sum()), int((bucket == k).sum()))
            for k in bucket.unique().tolist()}


def add_parts(needs: list[dict]) -> dict:
    """Parts of the same names added (several decode batches', or a critic's and a cost critic's
    in one phase), one after the other."""
    total: dict = {}
    for parts in needs:
        for name, p in parts.items():
            have = total.get(name, Part(0.0, 0.0, 0))
            total[name] = Part(have.flops + p.flops, have.nbytes + p.nbytes, have.passes + p.passes)
    return total


def _prompt_columns(steps: torch.Tensor, prompt: torch.Tensor, begun: torch.Tensor, rank: torch.Tensor,
                    span: int) -> torch.Tensor:
    """(span,) at decoding step s, the trie nodes of the prompts of the groups with more than s
    steps (`prompt_prefix.trie_size`)."""
    lengths, begun_list, rank_list = prompt.tolist(), begun.tolist(), rank.tolist()
    sizes = {int(t): trie_size(lengths, begun_list, rank_list, (steps > t).tolist()) for t in steps.unique()}
    at = torch.tensor([sizes[int(t)] for t in steps.unique()])
    # the running set changes only where a group's steps end: step s has the set of the largest value below s + 1
    ends = steps.unique()  # sorted
    index = torch.searchsorted(ends, torch.arange(span), right=True) - 1
    full = trie_size(lengths, begun_list, rank_list, [True] * len(lengths))
    return torch.where(index >= 0, at[index.clamp(min=0)], full)


def update_flops(shape: ModelShape, lm_head: bool, rows: StepRows, epochs: int, optimizer_steps: int) -> float:
    """FLOPs of an update of `rows`: a forward and a backward of every epoch's rows
    (`scoring_counts`), and those of the tokens every prompt begins with in each optimizer step
    after an epoch's first."""
    shared = rows.shared_by_all()
    again = Counts(shared, causal_sum(0, shared), 0)
    return (1 + BACKWARD) * (epochs * forward_flops(shape, lm_head, scoring_counts(rows))
                             + max(0, optimizer_steps - epochs) * forward_flops(shape, lm_head, again))


def _still_running(steps: torch.Tensor, weight: torch.Tensor, span: int) -> torch.Tensor:
    """(span,) at decoding step s, the sum of `weight` over the rows with more than s steps."""
    ended = torch.zeros(span + 1, dtype=torch.long).index_add_(0, steps.clamp(max=span), weight)
    return (weight.sum() - ended.cumsum(0))[:span]


def generation_bytes(shape: ModelShape, rows: StepRows, batch_rows: int, dtype_bytes: int) -> float:
    """Bytes generation reads (`generation_parts`): per decode batch the weights at its prefill and
    at each decoding step (its longest response less one), and the KV cache."""
    return whole(generation_parts(shape, rows, batch_rows, dtype_bytes))[1]


def update_parts(shape: ModelShape, lm_head: bool, dtype_bytes: int, optimizer_steps: int,
                 trained_params: int, flops: float) -> dict[str, Part]:
    """An update's `flops` in its forward and backward passes, which read the weights twice per
    optimizer step, then AdamW's steps, which wait for the gradients: the fp32 state of the
    trained parameters read and written once each."""
    passes = Part(flops, optimizer_steps * 2 * weights_bytes(shape, lm_head, dtype_bytes), optimizer_steps)
    adamw = Part(0.0, float(optimizer_steps * ADAMW_BYTES_PER_PARAM * trained_params), optimizer_steps)
    return {"passes": passes, "optimizer": adamw}


def update_bytes(shape: ModelShape, lm_head: bool, dtype_bytes: int, optimizer_steps: int,
                 trained_params: int) -> float:
    """Bytes an update reads and writes: per optimizer step the weights in the forward and in the
    backward, and AdamW's fp32 state of the trained parameters."""
    return whole(update_parts(shape, lm_head, dtype_bytes, optimizer_steps, trained_params, 0.0))[1]


def lora_params(shape: ModelShape, rank: int, targets) -> int:
    """Trained parameters of LoRA adapters (A: rank x in, B: out x rank) on `targets` of every layer
    (`all-linear`: every projection of the decoder)."""
    sizes = {"q_proj": (shape.hidden, shape.hidden), "k_proj": (shape.hidden, shape.kv_dim),
             "v_proj": (shape.hidden, shape.kv_dim), "o_proj": (shape.hidden, shape.hidden),
             "gate_proj": (shape.hidden, shape.ffn), "up_proj": (shape.hidden, shape.ffn),
             "down_proj": (shape.ffn, shape.hidden)}
    names = LORA_TARGETS if targets == "all-linear" else [t for t in targets if t in sizes]
    return shape.layers * sum(rank * sum(sizes[name]) for name in names)
