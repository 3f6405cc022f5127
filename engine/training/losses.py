"""Policy losses, the loss aggregation switch and KL estimators: pure functions on (B, T) tensors.

`mask` is 1 on response tokens and 0 on padding. Every loss reduces its per-token values
with `aggregate` (default `token-mean`); `normalizer` replaces the local count it divides
by, which is how the update makes the mean span a whole mini-batch split into
micro-batches and ranks.

The policy losses are registered by name (`POLICY_LOSSES`, the recipe's `<algorithm>.policy_loss`):
the actor asks for one and calls it with the same arguments whichever it is. A new loss is one
function decorated with `register_policy_loss` here and its name in the recipe's `PolicyLossName`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


# The loss aggregation modes, as verl names them (`actor.loss_agg_mode`); see `aggregate`.
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              normalizer: float | None = None, horizon: int | None = None) -> torch.Tensor:
    """One scalar loss from per-token losses (B, T) and the response mask (B, T).

    token-mean               sum_{i,t} m*x / sum_{i,t} m        every token weighs the same (DAPO,
                             Yu et al. 2025, arXiv 2503.14476, eq. 12; hflow's default)
    seq-mean-token-mean      1/B' sum_i (sum_t m*x / sum_t m)   each sequence weighs the same
                             (the original GRPO, Shao et al. 2024, arXiv 2402.03300, eq. 3)
    seq-mean-token-sum       1/B' sum_i sum_t m*x
    seq-mean-token-sum-norm  1/B' sum_i sum_t m*x / horizon     a constant divisor, no length bias
                             (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783, Sec. 3.1)
    B' counts the sequences with at least one response token. `normalizer` replaces the
    divisor: the response tokens (token-mean) or the sequences (seq-mean-*) of the whole
    mini-batch, per rank. `horizon` is the maximum response length (default T, the
    mask's width, which is only constant when the batch is padded to it).
    """
    if mode == "token-mean":
        total = (per_token * mask).sum()
        return total / normalizer if normalizer is not None else total / mask.sum().clamp(min=1)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; accepted: {', '.join(LOSS_AGG_MODES)}")
    token_sums = (per_token * mask).sum(-1)
    lengths = mask.sum(-1)
    if mode == "seq-mean-token-mean":
        per_sequence = token_sums / lengths.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        per_sequence = token_sums
    else:
        per_sequence = token_sums / (horizon or mask.shape[-1])
    sequences = normalizer if normalizer is not None else (lengths > 0).sum().clamp(min=1)
    return per_sequence.sum() / sequences


# Off-policy corrections of the policy loss (`actor.off_policy_correction`); see `behaviour_weights`.
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled")


def capped_weights(log_weights: torch.Tensor, cap: float, mode: str = "tis") -> torch.Tensor:
    """Importance weights w = exp(log_weights), any shape, capped at `cap` the way `mode` says:

    tis        min(w, cap)                 truncated importance sampling (Ionides 2008; for RL
               frameworks whose sampler is not the trained policy: Yao et al. 2025, "Your
               efficient RL framework secretly brings you off-policy RL training", verl's TIS)
    decoupled  w if w <= cap else 0        AReaL's decoupled PPO objective (Fu et al. 2025,
               arXiv 2505.24298, Sec. 4): a token whose weight passes the cap is left out
    none       1
    No gradient flows through the weights (they are constants of the update).
    """
    log_weights = log_weights.detach()
    if mode == "none":
        return torch.ones_like(log_weights)
    weights = torch.exp(log_weights.clamp(max=20.0))  # exp(20) is far past any cap: no overflow
    if mode == "tis":
        return weights.clamp(max=cap)
    if mode == "decoupled":
        return torch.where(weights <= cap, weights, torch.zeros_like(weights))
    raise ValueError(f"unknown off-policy correction {mode!r}; accepted: {', '.join(OFF_POLICY_CORRECTIONS)}")


def behaviour_weights(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, cap: float,
                      mode: str = "tis") -> torch.Tensor:
    """(B, T) per-token weights pi_prox / pi_behav, capped (`capped_weights`).

    The behaviour policy sampled the rollout (its log-probs came with the generation, possibly
    some policy versions ago: asynchronous rollout); the proximal policy is the one the PPO ratio
    is clipped against (`old_log_probs`, scored by the training engine before the update). The
    policy loss is then  w * max(-A * r, -A * clip(r)),  r = pi_theta / pi_prox: AReaL's
    decoupled objective (eq. 5) with `decoupled`, verl's TIS-corrected PPO loss with `tis`.
    """
    return capped_weights(proximal_log_probs - behaviour_log_probs, cap, mode)


def sequence_behaviour_weights(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor,
                               mask: torch.Tensor, cap: float, mode: str = "tis") -> torch.Tensor:
    """(B,) the sequence-level weight for GSPO's sequence ratio: the length-normalised (geometric
    mean) ratio exp(1/|y| sum_t (prox - behav)), as GSPO normalises its own ratio (Zheng et al.
    2025, arXiv 2507.18071, eq. 7), then capped (`capped_weights`)."""
    mask = mask.to(proximal_log_probs.dtype)
    mean_log = ((proximal_log_probs - behaviour_log_probs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return capped_weights(mean_log, cap, mode)


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss. `fn(log_probs, old_log_probs, advantages, mask, clip_low, clip_high,
    normalizer=, mode=, horizon=, weights=) -> (loss, metrics)`, all tensors (B, T) but `weights`
    and a per-sequence `advantages` (B,). `per_sequence`: one importance ratio per sequence
    (GSPO), so the loss is a mean over sequences and an off-policy correction weighs whole
    sequences; otherwise per token."""

    name: str
    fn: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    per_sequence: bool = False


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str, per_sequence: bool = False) -> Callable:
    """Decorator: make `fn` the policy loss `name` (see `PolicyLoss`)."""
    def add(fn: Callable) -> Callable:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = PolicyLoss(name, fn, per_sequence)
        return fn
    return add


def policy_loss(name: str) -> PolicyLoss:
    """The registered policy loss `name`."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; accepted: {', '.join(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


@register_policy_loss("ppo")
def ppo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                    normalizer: float | None = None, mode: str = "token-mean",
                    horizon: int | None = None,
                    weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv 1707.06347, eq. 7), negated.

    All inputs (B, T); `advantages` may also be (B,) and is then broadcast over tokens.
    Per token: max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)), r = exp(logp - old),
    times `weights` (B, T) when given (an off-policy correction: `behaviour_weights`),
    reduced by `aggregate(per_token, mask, mode, normalizer, horizon)`. Returns the loss and metrics: clipfrac (share of tokens where clipping is active)
    and approx_kl (token-mean of old - new log-prob).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    mask = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(per_token, mask, mode, normalizer, horizon)
    with torch.no_grad():
        metrics = {
            "clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
            "approx_kl": float(masked_mean(-log_ratio, mask)),
        }
    return loss, metrics


@register_policy_loss("gspo", per_sequence=True)
def gspo_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, clip_low: float = 3e-4, clip_high: float = 4e-4,
                     normalizer: float | None = None, mode: str = "seq-mean-token-mean",
                     horizon: int | None = None,
                     weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's clipped sequence-level surrogate (Zheng et al. 2025, arXiv 2507.18071, eqs. 5-7), negated.

    log_probs, old_log_probs, mask: (B, T); advantages: (B,), one per sequence (a (B, T)
    tensor is read at each row's first response token). Per sequence i, with |y_i| its
    response tokens:
        s_i    = exp(1/|y_i| sum_t (log_probs - old_log_probs))     the length-normalised ratio
        loss_i = max(-A_i * s_i, -A_i * clip(s_i, 1 - clip_low, 1 + clip_high))
    and the loss is the mean of loss_i over the sequences with at least one token
    (`normalizer` replaces their count, as `aggregate`'s seq-mean modes). The clip range
    is on a per-token-averaged log-ratio, so it is small (the paper: 3e-4 and 4e-4).
    `weights` (B,), when given, multiply loss_i (`sequence_behaviour_weights`). `mode` must be
    seq-mean-token-mean, the only aggregation of one term per sequence (`horizon` is unused).
    Returns the loss and metrics: clipfrac (share of sequences clipped), approx_kl.
    """
    if mode != "seq-mean-token-mean":
        raise ValueError(f"GSPO's loss is one term per sequence: loss aggregation {mode!r} is not defined for it")
    mask = mask.to(log_probs.dtype)
    if advantages.dim() == 2:
        first = (mask * torch.arange(mask.shape[1], 0, -1, device=mask.device)).argmax(-1)
        advantages = advantages.gather(1, first[:, None]).squeeze(1)
    log_ratio = log_probs - old_log_probs
    lengths = mask.sum(-1)
    seq_ratio = torch.exp((log_ratio * mask).sum(-1) / lengths.clamp(min=1))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1.0 - clip_low, 1.0 + clip_high)
    has_tokens = (lengths > 0).to(log_probs.dtype)
    per_sequence = torch.maximum(unclipped, clipped) * has_tokens
    if weights is not None:
        per_sequence = per_sequence * weights
    count = normalizer if normalizer is not None else has_tokens.sum().clamp(min=1)
    loss = per_sequence.sum() / count
    with torch.no_grad():
        metrics = {
            "clipfrac": float(masked_mean((clipped > unclipped).float(), has_tokens)),
            "approx_kl": float(masked_mean(-log_ratio, mask)),
        }
    return loss, metrics


@register_policy_loss("cispo")
def cispo_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor, clip_low: float = 1.0, clip_high: float = 0.28,
                      normalizer: float | None = None, mode: str = "token-mean", horizon: int | None = None,
                      weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO's objective (MiniMax-M1, MiniMax 2025, arXiv 2506.13585, eqs. 4-5), negated: every
    token's log-likelihood weighed by its advantage and by its importance ratio, clipped and held
    constant.

    All inputs (B, T); `advantages` may be (B,). Per token, r = exp(log_probs - old_log_probs):
        -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * log_probs
    times `weights` when given, reduced by `aggregate` (the paper: token-mean). PPO's clip drops
    the gradient of a token whose ratio left the range; here every token keeps a gradient,
    A * clip(r) * grad log p, only its weight is capped. The paper sets no lower bound (a large
    clip_low: 1.0 puts it at 0) and tunes clip_high. Metrics: clipfrac (share of tokens whose
    weight was clipped), approx_kl.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(log_probs)
    mask = mask.to(log_probs.dtype)
    log_ratio = (log_probs - old_log_probs).detach()
    ratio = torch.exp(log_ratio.clamp(max=20.0))  # exp(20) is far past any clip: no overflow
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = -clipped * advantages * log_probs
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(per_token, mask, mode, normalizer, horizon)
    with torch.no_grad():
        metrics = {"clipfrac": float(masked_mean((clipped != ratio).float(), mask)),
                   "approx_kl": float(masked_mean(-log_ratio, mask))}
    return loss, metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.2, normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss (Schulman et al. 2017's baselines `ppo2`; Andrychowicz et al.
    2021, arXiv 2006.05990, Sec. 3.1), as in verl, OpenRLHF and safe-rlhf.

    All inputs (B, T). Per token, with v' = old + clamp(v - old, -clip, clip):
        0.5 * max((v - R)^2, (v' - R)^2)
    `clip=None` gives the plain 0.5 * (v - R)^2. Returns the loss and metrics: clipfrac
    (share of tokens where the clipped term is the larger) and vpred_mean.
    """
    mask = mask.to(values.dtype)
    unclipped = (values - returns).square()
    if clip is None:
        per_token, clipped = unclipped, unclipped
    else:
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (clipped_values - returns).square()
        per_token = torch.maximum(unclipped, clipped)
    loss = 0.5 * aggregate(per_token, mask, "token-mean", normalizer)
    with torch.no_grad():
        metrics = {
            "clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
            "vpred_mean": float(masked_mean(values.detach(), mask)),
        }
    return loss, metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over masked tokens: 1 is a perfect critic,
    0 no better than a constant, below 0 worse (the `explained_variance` of OpenAI baselines)."""
    mask = mask.to(torch.float32)
    var_returns = masked_mean((returns - masked_mean(returns, mask)).square(), mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)).square(), mask)
    if float(var_returns) == 0.0:
        return float("nan")
    return float(1.0 - var_residual / var_returns)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens (B, T).

    Schulman, "Approximating KL Divergence" (2020), with d = ref_logp - logp:
      k1 = -d                   unbiased, high variance, can be negative
      k2 = d^2 / 2              biased, low variance
      k3 = exp(d) - d - 1       unbiased, low variance, never negative
      abs = |d|
    """
    d = ref_logprobs - logprobs
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        # Clamp d before exp so that one runaway token cannot overflow the loss.
        d = d.clamp(-20.0, 20.0)
        return torch.exp(d) - d - 1.0
    if kind == "abs":
        return d.abs()
    raise ValueError(f"unknown KL estimator {kind!r}; accepted: k1, k2, k3, abs")
