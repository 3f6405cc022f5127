"""Advantage estimators, registered by name (`ADVANTAGE_ESTIMATORS`), and what they share.

Each takes per-sequence or per-token rewards and returns advantages; their arguments differ
(a group id per row, a critic's values, a greedy baseline), so an algorithm program calls the
one its method needs, and the registry is the catalogue a user's own program picks from.
Shapes: B = batch (sequences), T = response tokens.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from hflow.engine.rlmath.registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(scores: torch.Tensor, group_ids: Sequence[Hashable], eps: float = 1e-6,
         scale_by_std: bool = True) -> torch.Tensor:
    """Group-relative advantages (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, eq. 3).

    scores: (B,) one scalar reward per sequence. group_ids: B hashable ids; sequences
    with the same id answer the same prompt. Returns (B,):
        (score - group mean) / (group std + eps)   with the unbiased std (n - 1, as torch.std)
    With `scale_by_std=False` the division is dropped (Dr. GRPO, Liu et al. 2025,
    arXiv 2503.20783). A group of one has mean 0 and std 1 by convention, so its
    advantage is its score.
    """
    if scores.dim() != 1 or len(group_ids) != scores.shape[0]:
        raise ValueError(f"scores must be (B,) with one group id per row; got {tuple(scores.shape)} "
                         f"and {len(group_ids)} ids")
    index: dict[Hashable, list[int]] = {}
    for row, gid in enumerate(group_ids):
        index.setdefault(gid, []).append(row)
    advantages = torch.empty_like(scores, dtype=torch.float32)
    for rows in index.values():
        group = scores[rows].float()
        if len(rows) == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = group.mean(), group.std()
        centred = group - mean
        advantages[rows] = centred / (std + eps) if scale_by_std and len(rows) > 1 else centred
    return advantages


def _group_rows(group_ids: Sequence[Hashable], count: int) -> list[list[int]]:
    if len(group_ids) != count:
        raise ValueError(f"need one group id per row; got {len(group_ids)} ids for {count} rows")
    index: dict[Hashable, list[int]] = {}
    for row, gid in enumerate(group_ids):
        index.setdefault(gid, []).append(row)
    return list(index.values())


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(scores: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740, eq. 9;
    Kool et al. 2019).

    scores: (N,) one reward per sequence; group_ids: N ids, equal for the k samples of one
    prompt. Returns (N,): each score minus the mean of the OTHER k - 1 scores of its group,
        A_i = r_i - 1/(k-1) sum_{j != i} r_j  =  k/(k-1) * (r_i - mean_group(r))
    A group of one has no other sample to compare with: it is an error (ValueError), since
    a baseline of 0 would silently turn RLOO into plain REINFORCE for that prompt.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be (N,); got {tuple(scores.shape)}")
    advantages = torch.empty_like(scores, dtype=torch.float32)
    for rows in _group_rows(group_ids, scores.shape[0]):
        if len(rows) < 2:
            raise ValueError(f"RLOO needs at least 2 samples per prompt; group {group_ids[rows[0]]!r} has 1")
        group = scores[rows].float()
        others_mean = (group.sum() - group) / (len(rows) - 1)
        advantages[rows] = group - others_mean
    return advantages


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_plus_plus(token_rewards: torch.Tensor, mask: torch.Tensor,
                        gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu et al. 2025, arXiv 2501.03262, Sec. 3): reward-to-go, whitened over the batch.

    token_rewards, mask: (B, T); the token rewards carry the per-token KL penalty and the
    score on the last response token (`token_rewards`). Per sequence, from the end:
        returns_t    = r_t + gamma * returns_{t+1}              (masked tokens are skipped)
        advantages   = whiten(returns) over every response token of the batch
    Returns (advantages, returns), both (B, T), zero where `mask` is 0. No critic, no
    per-prompt baseline: the batch-wide normalisation is the baseline.
    """
    mask = mask.to(torch.float32)
    rewards = token_rewards.float() * mask
    returns = torch.zeros_like(mask)
    running = torch.zeros(len(mask))
    for t in reversed(range(mask.shape[1])):
        m = mask[:, t]
        running = m * (rewards[:, t] + gamma * running) + (1 - m) * running
        returns[:, t] = running * m
    return whiten(returns, mask), returns


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_plus_plus_baseline(scores: torch.Tensor, group_ids: Sequence[Hashable],
                                 mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262, v3+, Sec. 3.2; OpenRLHF's
    `reinforce_baseline`): the prompt's mean reward as baseline, then batch normalisation.

    scores: (B,); group_ids: B ids (the samples of one prompt share one); mask: (B, T).
    Returns (B, T): (score - group mean) on every response token of the row, whitened
    over all response tokens of the batch; 0 where `mask` is 0. A group of one is
    centred on itself (advantage 0 before whitening). The KL is not in these advantages:
    REINFORCE++-baseline adds it to the loss (the `k2` estimator in the paper).
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be (B,); got {tuple(scores.shape)}")
    centred = torch.empty_like(scores, dtype=torch.float32)
    for rows in _group_rows(group_ids, scores.shape[0]):
        group = scores[rows].float()
        centred[rows] = group - group.mean()
    mask = mask.to(torch.float32)
    return whiten(centred[:, None] * mask, mask)


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards from one score per sequence and an optional per-token KL penalty.

    scores: (B,). mask: (B, T), 1 on response tokens. kl: (B, T) per-token KL estimate.
    Returns (B, T): -kl_coef * kl on every response token, plus the score on the last
    response token (the last 1 of `mask`); zero where `mask` is 0. This is the reward of
    Ziegler et al. 2019 (arXiv 1909.08593, eq. 2) and InstructGPT (arXiv 2203.02155, eq. 2),
    with the KL charged token by token as in verl, OpenRLHF and safe-rlhf.
    """
    mask = mask.to(torch.float32)
    rewards = torch.zeros_like(mask)
    if kl is not None and kl_coef:
        rewards = -kl_coef * kl.float() * mask
    has_tokens = mask.sum(-1) > 0
    last = (mask * torch.arange(1, mask.shape[1] + 1)).argmax(-1)
    rows = torch.arange(len(mask))[has_tokens]
    rewards[rows, last[has_tokens]] += scores.float()[has_tokens]
    return rewards


@ADVANTAGE_ESTIMATORS.register("gae")
def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16).

    token_rewards, values, mask: (B, T); values[t] is the critic's V(s_t), the state before
    response token t. Per sequence, from the last token back:
        delta_t = r_t + gamma * V(s_next) - V(s_t)      V after the last token is 0
        A_t     = delta_t + gamma * lam * A_next
    where `next` is the next position whose mask is 1: masked positions (padding, or
    tokens the policy did not produce) are skipped, not treated as steps. Returns
    (advantages, returns = advantages + values), both (B, T), zero where `mask` is 0.
    Not whitened (see `whiten`).
    """
    mask = mask.to(torch.float32)
    rewards, values = token_rewards.float() * mask, values.float() * mask
    next_value = torch.zeros(len(mask))
    next_adv = torch.zeros(len(mask))
    advantages = torch.zeros_like(mask)
    for t in reversed(range(mask.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = adv * m
        # A masked position passes the next valid position's value and advantage through.
        next_value = m * values[:, t] + (1 - m) * next_value
        next_adv = m * adv + (1 - m) * next_adv
    returns = (advantages + values) * mask
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("remax")
def remax(token_rewards: torch.Tensor, baseline_scores: torch.Tensor,
          mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv 2310.10505, Algorithm 1): REINFORCE with a greedy baseline.

    token_rewards, mask: (B, T); baseline_scores: (B,), the reward of the greedy response to
    the same prompt. Returns, both (B, T) and zero where `mask` is 0:
        returns_t    = sum_{s >= t} r_s           (reward-to-go, undiscounted)
        advantages_t = returns_t - baseline
    With the KL in the token rewards, a token's advantage is its sampled sequence's score
    minus the greedy score, less the KL still to come.
    """
    mask = mask.to(torch.float32)
    returns = (token_rewards.float() * mask).flip(-1).cumsum(-1).flip(-1) * mask
    advantages = (returns - baseline_scores.float()[:, None]) * mask
    return advantages, returns


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) over the positions where `mask` is 1; 0 elsewhere.

    values, mask: (B, T) or (B,). The variance is unbiased (n - 1), as in verl's and TRL's
    `masked_whiten`. With `shift_mean=False` the mean is added back (scale only).
    """
    mask = mask.to(torch.float32)
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1)
    var = ((values - mean).square() * mask).sum() / (count - 1).clamp(min=1)
    out = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask
