"""What a finished step writes besides its timings: the rollout's statistics in the step's event
(events.jsonl) and a few of its rows in samples.jsonl."""

from __future__ import annotations

import json
import math
from typing import Any

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.rlmath.aggregation import masked_mean
from hflow.engine.rlmath.kl import kl_estimate
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.episode_stats import episode_metrics, episode_sample
from hflow.trainer.control.nonfinite import finite


def rollout_metrics(batch: Batch, recipe: Recipe) -> dict[str, float]:
    """The step's rollout statistics; reward/* and cost/* of the finite scores only (a skipped
    step's NaN or inf rows are left out, and a step without any finite score has none)."""
    scores = finite(batch[col.SCORES].float())
    mask = batch[col.RESPONSE_MASK].float()
    lengths = mask.sum(-1)
    metrics = {
        **({"reward/mean": float(scores.mean()),
            "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
            "reward/min": float(scores.min()),
            "reward/max": float(scores.max())} if len(scores) else {}),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "entropy/mean": float(masked_mean(batch[col.ENTROPY], mask)),
    }
    if col.REF_LOG_PROBS in batch:
        kl = kl_estimate(batch[col.OLD_LOG_PROBS], batch[col.REF_LOG_PROBS], recipe.kl.estimator)
        metrics["kl/mean"] = float(masked_mean(kl, mask))
    if col.EPISODE in batch:
        metrics.update(episode_metrics(batch[col.EPISODE]))
    costs = finite(batch[col.COSTS].float()) if col.COSTS in batch else []
    if len(costs):
        metrics.update({"cost/mean": float(costs.mean()), "cost/max": float(costs.max()),
                        "cost/std": float(costs.std()) if len(costs) > 1 else 0.0})
    return metrics


def samples(batch: Batch, step: int, count: int) -> list[dict[str, Any]]:
    rows = range(0, len(batch), max(1, len(batch) // max(1, count)))
    out = []
    for row in list(rows)[:count]:
        prompt = batch[col.PROMPT][row]
        out.append({
            "step": step,
            "prompt": prompt if isinstance(prompt, str) else json.dumps(prompt),
            "response": batch[col.RESPONSE_TEXT][row],
            "reward": _number(batch[col.SCORES][row]),
            **({"cost": _number(batch[col.COSTS][row])} if col.COSTS in batch else {}),
            **({"episode": episode_sample(batch[col.EPISODE][row])} if col.EPISODE in batch else {}),
        })
    return out


def _number(value) -> float | None:
    """A score for samples.jsonl: None for NaN or inf, which JSON has no numbers for."""
    return float(value) if math.isfinite(float(value)) else None
