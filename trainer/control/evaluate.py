"""Evaluation on held-out prompts, run by the controller between steps (and by `hflow eval`).

The controller sends each set's prompts to the actor's `generate_sequences` with the set's
sampling in the batch's meta (so the recipe's engine, hf or vllm, generates them) and scores the
responses: with the reward role (a response is right when its reward is >= 1), or by comparing the
answer a set's `extract` rule reads in the response with the row's answer column.

`data.eval`, sampled as the `eval` section says (eval.n, eval.temperature), logs:

  eval/reward           mean reward over every eval response
  eval/accuracy         share of responses right (for 0/1 rewards such as exact_match or
                        arithmetic: the share answered right)
  eval/pass@n           (eval.n > 1) share of prompts with at least one right response
  eval/response_length  mean response length in tokens
  eval/cutoff_share     share of responses stopped by the length limit (no end-of-sequence token);
                        of episodes (`rollout.env`), those with a turn stopped by
                        rollout.max_turn_tokens or that ran out of room
  eval/tool_call_share  (`rollout.env` environments that count tool calls) share of eval
                        episodes that called a tool

Each set of `eval.sets` logs, under eval/<name>/: accuracy, response_length, cutoff_share (and
reward when the reward scores it, tool_call_share in tool environments) of one greedy response per
prompt; with k > 1 also mean@k (the
mean share right of k sampled responses) and pass@k (the share of prompts with a right one among
them; the plain empirical estimate, which with n = k samples is the unbiased one of Chen et al.
2021).

Every metric is a mean over prompts of a per-prompt value; `Evaluator.outcomes` keeps those values
so that two models can be compared prompt by prompt (`hflow eval --compare`). Evaluation draws from
its own seed streams, never the rollout's or the data's, and changes no state: a run with
evaluation trains exactly as the same run without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dist import pick_device
from hflow.engine.models.loading import config_and_eos, load_tokenizer
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.episode_stats import episode_metrics
from hflow.trainer.data.answers import is_right
from hflow.trainer.data.eval_sets import read_set_rows
from hflow.trainer.data.prompts import encode_rows
from hflow.trainer.data.rows import read_eval_rows
from hflow.trainer.placement.cpu_share import share_for
from hflow.trainer.placement.worker_groups import build_worker_groups

CORRECT = 1.0  # a response counts as right when its reward reaches this


@dataclass
class HeldOut:
    """One held-out set and how it is sampled: `passes` are (kind, sampling) with kind `main`
    (data.eval's own sampling), `greedy` or `sampled` (eval.sets)."""

    prefix: str  # "eval/" (data.eval) or "eval/<name>/"
    rows: list[dict]
    passes: list[tuple[str, dict]]
    extract: str = "reward"
    answer_key: str = "answer"


def eval_metrics(scores: torch.Tensor, lengths: torch.Tensor, n: int) -> dict[str, float]:
    """data.eval's metrics of P prompts x n responses, rows grouped by prompt (prompt 0's n rows
    first); scores, lengths: (P * n,)."""
    right = (scores.float() >= CORRECT).float()
    values = _per_prompt("main", right, scores, lengths, torch.zeros_like(right), n)
    return {f"eval/{k}": float(v.mean()) for k, v in values.items() if k != "cutoff_share"}


def _per_prompt(kind: str, right: torch.Tensor, scores: torch.Tensor | None, lengths: torch.Tensor,
                cut: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """The per-prompt values of one pass (see the module docstring for their names)."""
    by_prompt = lambda t: t.float().view(-1, n)  # noqa: E731
    if kind == "sampled":
        return {f"mean@{n}": by_prompt(right).mean(-1), f"pass@{n}": by_prompt(right).amax(-1)}
    out = {} if scores is None else {"reward": by_prompt(scores).mean(-1)}
    out["accuracy"] = by_prompt(right).mean(-1)
    if kind == "main" and n > 1:
        out[f"pass@{n}"] = by_prompt(right).amax(-1)
    out["response_length"] = by_prompt(lengths).mean(-1)
    out["cutoff_share"] = by_prompt(cut).mean(-1)
    return out


def cut_off(responses: torch.Tensor, mask: torch.Tensor, limit: int, eos: list[int]) -> torch.Tensor:
    """(rows,) 1.0 where a response reached `limit` tokens without ending in an end-of-sequence token."""
    lengths = mask.sum(-1)
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = responses.gather(1, (positions * mask.long()).amax(-1, keepdim=True)).squeeze(1)  # the last scored token
    ended = torch.isin(last, torch.tensor(eos, dtype=last.dtype))
    return ((lengths >= limit) & ~ended).float()


class Evaluator:
    """The eval sets of a recipe, tokenized once; `run` scores the current policy on them."""

    def __init__(self, recipe: Recipe, tokenizer):
        self.recipe, self.tokenizer = recipe, tokenizer
        function = None if recipe.reward.model else recipe.reward.function
        e, r = recipe.eval, recipe.rollout
        self.sets: list[HeldOut] = []
        if recipe.data.eval:
            sampling = {"n": e.n, "temperature": e.temperature, "batch_size": e.batch_size,
                        "max_response_length": e.response_limit(r.max_response_length)}
            self.sets.append(HeldOut("eval/", read_eval_rows(recipe.data, function, recipe.seed), [("main", sampling)]))
        for s in e.sets:
            limit = e.response_limit(r.max_response_length, s)
            passes = [("greedy", {"n": 1, "temperature": 0.0, "max_response_length": limit,
                                  "batch_size": e.batch_size})]
            if s.k > 1:
                passes.append(("sampled", {"n": s.k, "temperature": s.temperature, "max_response_length": limit,
                                           "batch_size": e.batch_size, "stream": f"eval/{s.name}"}))
            self.sets.append(HeldOut(f"eval/{s.name}/", read_set_rows(s, function, recipe.seed), passes,
                                     s.extract, s.answer_key))
        for held_out in self.sets:
            encode_rows(held_out.rows, tokenizer, recipe.data.max_prompt_length)
        self.eos = _eos_ids(recipe, tokenizer)

    def run(self, actor, reward, step: int) -> dict[str, float]:
        """Generate with `actor`, score with `reward` (worker groups), return the eval/* metrics."""
        return means(self.outcomes(actor, reward, step))

    def outcomes(self, actor, reward, step: int) -> dict[str, dict[str, torch.Tensor]]:
        """Per set (by its metric prefix), each metric's per-prompt values; data.eval's tool-call
        share rides along as a one-element value."""
        out = {}
        for held_out in self.sets:
            values: dict[str, torch.Tensor] = {}
            for kind, sampling in held_out.passes:
                values |= self._pass(held_out, kind, sampling, actor, reward, step)
            out[held_out.prefix] = values
        return out

    def _pass(self, held_out: HeldOut, kind: str, sampling: dict, actor, reward, step: int) -> dict[str, torch.Tensor]:
        rows = held_out.rows
        padded = rows + rows[:(-len(rows)) % actor.world_size]  # whole shares for every rank
        columns = {key: [row.get(key) for row in padded] for key in rows[0]}
        columns[col.UID] = list(range(len(padded)))
        batch = actor.generate_sequences(Batch(columns=columns, meta={"step": step, "eval": sampling}))
        n, keep = sampling["n"], len(rows) * sampling["n"]  # the padding rows are left out of the metrics
        mask = batch[col.RESPONSE_MASK][:keep]
        scores = None
        if held_out.extract == "reward":
            batch |= reward.compute_reward(batch)
            scores = batch[col.SCORES][:keep]
            right = (scores.float() >= CORRECT).float()
        else:
            answers = batch[held_out.answer_key][:keep]
            texts = [self.tokenizer.decode(r[m.bool()].tolist(), skip_special_tokens=True)
                     for r, m in zip(batch[col.RESPONSES][:keep], mask)]
            right = torch.tensor([float(is_right(held_out.extract, t, a)) for t, a in zip(texts, answers)])
        cut = cut_off(batch[col.RESPONSES][:keep], mask, sampling["max_response_length"], self.eos)
        if col.EPISODE in batch:  # an episode is cut off when one of its turns was, or it ran out of room
            cut = torch.maximum(cut, torch.tensor([float(e["ended"] == "max_tokens" or any(t.get("cut") for t in e["turns"]))
                                                   for e in batch[col.EPISODE][:keep]]))
        values = _per_prompt(kind, right, scores, mask.sum(-1), cut, n)
        if kind != "sampled" and col.EPISODE in batch:
            share = episode_metrics(batch[col.EPISODE][:keep]).get("episode/tool_call_share")
            if share is not None:
                values["tool_call_share"] = torch.tensor([share])
        return values


def means(outcomes: dict[str, dict[str, torch.Tensor]]) -> dict[str, float]:
    """The eval/* metrics of `Evaluator.outcomes`: each per-prompt value's mean over the prompts."""
    return {prefix + name: float(v.float().mean()) for prefix, values in outcomes.items() for name, v in values.items()}


def _eos_ids(recipe: Recipe, tokenizer) -> list[int]:
    """The tokens that end a response (the model's generation config's, else the tokenizer's)."""
    try:
        return config_and_eos(recipe.model.path, tokenizer, recipe.model.trust_remote_code)[1]
    except (OSError, ValueError):  # a model built at start-up (model.init) has no folder yet
        return [tokenizer.eos_token_id]


def evaluate_outcomes(recipe: Recipe, checkpoint: str | None, step: int) -> dict[str, dict[str, torch.Tensor]]:
    """`Evaluator.outcomes` of `recipe.model.path`, or of a run's checkpoint directory `checkpoint`
    (its actor's weights) on the recipe's workers; `step` picks the eval seed streams (as
    training's eval at that step)."""
    evaluator = Evaluator(recipe, load_tokenizer(recipe.model.path, recipe.model.trust_remote_code))
    device = pick_device(recipe.trainer.device)
    groups = build_worker_groups(recipe, ["actor", "reward"], device)
    cpu = None
    try:
        # As a training run's steps: on a local CPU run the threads the cores other processes leave
        # free (measured while the models load), so that the threads' spin costs no one a slice.
        cpu = share_for(recipe, groups.backend, device)
        # The weights alone, in the generation dtype: no training engine or optimizer state.
        groups["actor"].init_generation(checkpoint=f"{checkpoint}/actor" if checkpoint else None)
        groups["reward"].init_model()
        cpu.before_step()
        return evaluator.outcomes(groups["actor"], groups["reward"], step)
    finally:
        if cpu is not None:
            cpu.restore()
        groups.shutdown()


def evaluate_model(recipe: Recipe, checkpoint: str | None, step: int) -> dict[str, float]:
    """eval/* of the model `evaluate_outcomes` scores."""
    return means(evaluate_outcomes(recipe, checkpoint, step))
