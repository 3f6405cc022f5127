"""Evaluation on held-out prompts, run by the controller between steps (and by `hflow eval`).

The controller sends the eval prompts to the actor's `generate_sequences` with the `eval`
section's sampling in the batch's meta (so the recipe's engine, hf or vllm, generates them),
scores the responses with the reward role, and logs:

  eval/reward           mean reward over every eval response
  eval/accuracy         share of responses whose reward is >= 1.0 (for 0/1 rewards such as
                        exact_match or arithmetic: the share answered right)
  eval/pass@n           (eval.n > 1) share of prompts with at least one response of reward >= 1.0
  eval/response_length  mean response length in tokens
  eval/tool_call_share  (`rollout.env` environments that count tool calls) share of eval
                        episodes that called a tool

Evaluation draws from its own seed stream ("eval"), never from the rollout's or the data's, and
changes no state: a run with evaluation trains exactly as the same run without it.
"""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dist import pick_device
from hflow.engine.models.loading import load_tokenizer
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.episode_stats import episode_metrics
from hflow.trainer.placement.worker_groups import build_worker_groups
from hflow.trainer.data.prompts import encode_rows, read_eval_rows

CORRECT = 1.0  # a response counts as right when its reward reaches this


def eval_metrics(scores: torch.Tensor, lengths: torch.Tensor, n: int) -> dict[str, float]:
    """Metrics of P prompts x n responses, rows grouped by prompt (prompt 0's n rows first).

    scores, lengths: (P * n,). pass@n is the plain empirical one (a right answer among the n
    drawn), not the unbiased estimator of Chen et al. 2021, which needs more samples than n.
    """
    right = (scores.float() >= CORRECT).float()
    metrics = {
        "eval/reward": float(scores.float().mean()),
        "eval/accuracy": float(right.mean()),
        "eval/response_length": float(lengths.float().mean()),
    }
    if n > 1:
        metrics[f"eval/pass@{n}"] = float(right.view(-1, n).amax(-1).mean())
    return metrics


class Evaluator:
    """The eval prompts of a recipe, tokenized once; `run` scores the current policy on them."""

    def __init__(self, recipe: Recipe, tokenizer):
        self.recipe = recipe
        function = None if recipe.reward.model else recipe.reward.function
        rows = read_eval_rows(recipe.data, function, recipe.seed)
        encode_rows(rows, tokenizer, recipe.data.max_prompt_length)
        self.rows = rows

    def sampling(self) -> dict:
        e, r = self.recipe.eval, self.recipe.rollout
        return {"n": e.n, "temperature": e.temperature,
                "max_response_length": e.max_response_length or r.max_response_length}

    def run(self, actor, reward, step: int) -> dict[str, float]:
        """Generate with `actor`, score with `reward` (worker groups), return the eval/* metrics."""
        world = actor.world_size
        rows = self.rows + self.rows[:(-len(self.rows)) % world]  # whole shares for every rank
        columns = {key: [row.get(key) for row in rows] for key in self.rows[0]}
        columns[col.UID] = list(range(len(rows)))
        prompts = Batch(columns=columns, meta={"step": step, "eval": self.sampling()})
        batch = actor.generate_sequences(prompts)
        batch |= reward.compute_reward(batch)
        n = self.recipe.eval.n
        keep = len(self.rows) * n  # the padding rows are left out of the metrics
        metrics = eval_metrics(batch[col.SCORES][:keep], batch[col.RESPONSE_MASK][:keep].sum(-1), n)
        if col.EPISODE in batch:
            share = episode_metrics(batch[col.EPISODE][:keep]).get("episode/tool_call_share")
            if share is not None:
                metrics["eval/tool_call_share"] = share
        return metrics


def evaluate_model(recipe: Recipe, checkpoint: str | None, step: int) -> dict[str, float]:
    """eval/* of `recipe.model.path`, or of a run's checkpoint directory `checkpoint` (its actor's
    weights) on the recipe's workers; `step` picks the eval seed stream (as training's eval at it)."""
    evaluator = Evaluator(recipe, load_tokenizer(recipe.model.path, recipe.model.trust_remote_code))
    groups = build_worker_groups(recipe, ["actor", "reward"], pick_device(recipe.trainer.device))
    try:
        groups["actor"].init_model(checkpoint=f"{checkpoint}/actor" if checkpoint else None)
        groups["reward"].init_model()
        return evaluator.run(groups["actor"], groups["reward"], step)
    finally:
        groups.shutdown()
