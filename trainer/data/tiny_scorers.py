"""Tiny reward and cost models that mean something, trained locally in seconds (no download).

`hflow init-model tiny-reward DIR --task digits` trains the tiny Llama sequence classifier
of `models.build_tiny_score_model` on synthetic data of a built-in task:

  reward  Bradley-Terry on preference pairs (Ouyang et al. 2022, eq. 1): two random
          responses to one prompt, the one the task's own scorer rates higher is preferred.
          Only the ranking is learnt; the scale of the scores is the model's own.
  cost    a regression (mean squared error) onto `synthetic_cost` (the share of high
          digits 5-9 in the first 8 characters), so that the cost model speaks the same
          units as `cost.function: synthetic_cost` and `safe_rlhf.cost_limit` keeps its meaning.

Random responses mix digits (high and low in random proportions), letters and punctuation
at random rates, 1-12 characters, half of them ending in <eos>, so that the models see
the whole range a policy explores. Held-out accuracy (reward: share of held-out pairs
ranked right; cost: mean absolute error) is returned and written to `DIR/hflow_scorer.json`.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import torch
import torch.nn.functional as F

from hflow.engine import columns as col
from hflow.engine.models.loading import TINY_CHARS, build_tiny_score_model
from hflow.engine.models.score_model import ScoreModel, last_token_scores
from hflow.engine.padding import positions
from hflow.errors import UserError
from hflow.trainer.data import tasks

OTHER_CHARS = "".join(c for c in TINY_CHARS if c not in string.digits)


def random_response(rng: random.Random) -> str:
    p_digit, p_high = rng.random(), rng.random()
    chars = []
    for _ in range(rng.randint(1, 12)):
        if rng.random() < p_digit:
            chars.append(rng.choice("56789" if rng.random() < p_high else "01234"))
        else:
            chars.append(rng.choice(OTHER_CHARS))
    return "".join(chars)


def _encode(tokenizer, prompts: list[str], responses: list[str], eos: list[bool]) -> dict[str, torch.Tensor]:
    rows = [tokenizer(p + r, add_special_tokens=False)[col.INPUT_IDS] + ([tokenizer.eos_token_id] if e else [])
            for p, r, e in zip(prompts, responses, eos)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return {col.INPUT_IDS: ids, col.ATTENTION_MASK: mask, col.POSITION_IDS: positions(mask)}


def _scores(scorer, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return last_token_scores(scorer(**inputs), inputs[col.ATTENTION_MASK])


def _examples(task: str, kind: str, count: int, rng: random.Random):
    """`count` (prompt, response, eos, target) examples: target = the task's score or the cost."""
    rows = tasks.make_rows(task, count, rng.randrange(2**31))
    out = []
    for row in rows:
        response = random_response(rng)
        target = tasks.high_digit_share(response) if kind == "cost" else tasks.score(task, response, row["answer"])
        out.append((row[col.PROMPT], response, rng.random() < 0.5, target))
    return out


def _loss(scorer, tokenizer, kind: str, batch) -> tuple[torch.Tensor, torch.Tensor]:
    prompts, responses, eos, target = zip(*batch)
    scores = _scores(scorer, _encode(tokenizer, list(prompts), list(responses), list(eos)))
    target = torch.tensor(target)
    if kind == "cost":
        return F.mse_loss(scores, target), (scores - target).abs().mean()
    # Pairs: rows (0, 1), (2, 3), ...; the higher target is chosen, ties carry no preference.
    first, second = scores[0::2], scores[1::2]
    sign = torch.sign(target[0::2] - target[1::2])
    keep = sign != 0
    margin = (first - second) * sign
    loss = -F.logsigmoid(margin[keep]).mean()
    return loss, (margin[keep] > 0).float().mean()


def train_tiny_scorer(out_dir: str | Path, kind: str, task: str = "digits", seed: int = 0,
                      steps: int = 100, batch_size: int = 64) -> dict:
    """Train and save a tiny reward (`kind="reward"`) or cost (`"cost"`) model; returns its card."""
    if kind not in ("reward", "cost"):
        raise UserError(f"tiny scorer kind {kind!r}; accepted: reward, cost")
    text_tasks = [t for t in tasks.TASKS if t not in tasks.SPLIT_TASKS]  # chat tasks are for real models
    if task not in text_tasks:
        raise UserError(f"--task {task!r}: unknown synthetic task for a tiny scorer; accepted: {', '.join(text_tasks)}")
    model, tokenizer = build_tiny_score_model("tiny", seed)
    scorer = ScoreModel(model.model, model.score)
    rng = random.Random(seed)
    held_out = _examples(task, kind, 512, random.Random(seed + 1))
    optimizer = torch.optim.AdamW(scorer.parameters(), lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0 - i / steps)  # linear decay to 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(steps):
            loss, _ = _loss(scorer, tokenizer, kind, _examples(task, kind, batch_size, rng))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(scorer.parameters(), 1.0)
            optimizer.step()
            schedule.step()
    with torch.no_grad():
        _, quality = _loss(scorer, tokenizer, kind, held_out)
    metric = "held_out_mean_abs_error" if kind == "cost" else "held_out_pair_accuracy"
    card = {"kind": kind, "task": task, "seed": seed, "steps": steps, metric: round(float(quality), 4),
            "target": "synthetic_cost (share of digits 5-9 in the first 8 characters)" if kind == "cost"
            else f"the {task} task's score (Bradley-Terry on pairs ranked by it)"}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "hflow_scorer.json").write_text(json.dumps(card, indent=2))
    return card
