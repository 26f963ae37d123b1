"""The RL math, as a registry of small pure tensor functions.

Each advantage estimator and policy loss is one decorated function of tensors, looked up by
name, so a new objective is one function, and each can be tested alone on hand-computed
values. Nothing here reads a config object: every knob is an argument.

Shapes: ``B`` samples, ``T`` response tokens. ``mask`` is 1.0 on sampled tokens, 0.0 after.
Log-ratios are computed in log space and clamped before ``exp`` so one extreme token cannot
overflow a whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

LOG_RATIO_LIMIT = 20.0

AdvantageFn = Callable[..., Tensor]
PolicyLossFn = Callable[..., "PolicyLoss"]

ADVANTAGES: dict[str, AdvantageFn] = {}
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def deco(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES[name] = fn
        return fn

    return deco


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES[name] = fn
        return fn

    return deco


# objective -> (advantage estimator, policy loss)
RECIPES: dict[str, tuple[str, str]] = {
    "grpo": ("group", "clipped"),
    "dr_grpo": ("group", "clipped"),
    "dapo": ("group", "clipped"),
    "gspo": ("group", "gspo"),
    "cispo": ("group", "cispo"),
    "rloo": ("leave_one_out", "clipped"),
    "reinforce_pp": ("reinforce_pp", "clipped"),
}


# -- groups --------------------------------------------------------------------------------
def _group_stats(rewards: Tensor, group_ids: Tensor, unbiased: bool) -> tuple[Tensor, Tensor,
                                                                               Tensor]:
    """Per-sample group mean, group std and group size (via scatter, no Python loop)."""
    n_groups = int(group_ids.max().item()) + 1
    ones = torch.ones_like(rewards)
    count = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_ids, ones)
    total = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_ids, rewards)
    mean = total / count
    centered = rewards - mean[group_ids]
    sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_ids, centered ** 2)
    denom = (count - 1).clamp(min=1) if unbiased else count
    std = (sq / denom).sqrt()
    return mean[group_ids], std[group_ids], count[group_ids]


def zero_variance_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Boolean per sample: its group's rewards are all equal (no learning signal)."""
    n_groups = int(group_ids.max().item()) + 1
    hi = torch.full((n_groups,), -torch.inf, dtype=rewards.dtype).scatter_reduce(
        0, group_ids, rewards, reduce="amax")
    lo = torch.full((n_groups,), torch.inf, dtype=rewards.dtype).scatter_reduce(
        0, group_ids, rewards, reduce="amin")
    return (hi == lo)[group_ids]


# -- advantage estimators (one scalar per sample) ------------------------------------------
@register_advantage("group")
def group_advantage(rewards: Tensor, group_ids: Tensor, *, std_normalize: bool,
                    unbiased: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO: reward minus the group mean, optionally over the group std (Dr.GRPO: no std)."""
    mean, std, _ = _group_stats(rewards, group_ids, unbiased)
    adv = rewards - mean
    return adv / (std + eps) if std_normalize else adv


@register_advantage("leave_one_out")
def leave_one_out_advantage(rewards: Tensor, group_ids: Tensor, *, std_normalize: bool,
                            unbiased: bool = True, eps: float = 1e-6) -> Tensor:
    """RLOO: reward minus the mean of the *other* samples of the group."""
    mean, std, count = _group_stats(rewards, group_ids, unbiased)
    adv = (rewards - mean) * count / (count - 1).clamp(min=1)
    return adv / (std + eps) if std_normalize else adv


@register_advantage("reinforce_pp")
def reinforce_pp_advantage(rewards: Tensor, group_ids: Tensor, *, std_normalize: bool,
                           unbiased: bool = True, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ with baseline: subtract the group mean, then normalise over the batch."""
    mean, _, _ = _group_stats(rewards, group_ids, unbiased)
    adv = rewards - mean
    if not std_normalize:
        return adv
    std = adv.std(unbiased=unbiased) if adv.numel() > 1 else torch.zeros(())
    return (adv - adv.mean()) / (std + eps)


# -- KL estimators (per token) -------------------------------------------------------------
def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """KL(pi || pi_ref) per token from samples of pi; d = log pi - log pi_ref."""
    d = (logp - ref_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(-d) - 1.0 + d
    raise ValueError(f"unknown KL estimator {estimator!r}")


# -- aggregation ---------------------------------------------------------------------------
def aggregate(values: Tensor, mask: Tensor, mode: str, max_tokens: int) -> Tensor:
    """Token values [B, T] -> one scalar, by the spec's loss aggregation."""
    per_seq_sum = (values * mask).sum(-1)
    if mode == "token_mean":
        return per_seq_sum.sum() / mask.sum().clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        return (per_seq_sum / mask.sum(-1).clamp(min=1.0)).mean()
    if mode == "seq_mean_token_sum":
        return per_seq_sum.mean()
    if mode == "seq_mean_token_sum_norm":
        return per_seq_sum.sum() / (values.shape[0] * max_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}")


# -- policy losses (per token) -------------------------------------------------------------
@dataclass(frozen=True)
class PolicyLoss:
    loss: Tensor  # [B, T] per-token loss, to be aggregated
    clipped: Tensor  # [B, T] 1.0 where clipping changed the objective


def _log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    return (logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def _clipped_surrogate(log_ratio: Tensor, adv: Tensor, low: float, high: float) -> PolicyLoss:
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - low, 1.0 + high) * adv
    return PolicyLoss(-torch.minimum(unclipped, clipped), (clipped < unclipped).float())


@register_policy_loss("clipped")
def clipped_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float,
                 clip_high: float) -> PolicyLoss:
    """PPO's clipped surrogate per token; asymmetric when clip_low != clip_high (DAPO)."""
    return _clipped_surrogate(_log_ratio(logp, old_logp), adv[:, None], clip_low, clip_high)


@register_policy_loss("gspo")
def gspo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float,
              clip_high: float) -> PolicyLoss:
    """GSPO: one ratio per sequence, exp of the length-normalised log-prob difference.

    Written in the GSPO-token form (sg(s_i) + log pi_t - sg(log pi_t)) so the value is the
    sequence ratio while the gradient flows through every token.
    """
    lengths = mask.sum(-1).clamp(min=1.0)
    seq_log_ratio = (_log_ratio(logp, old_logp) * mask).sum(-1) / lengths
    token_log_ratio = seq_log_ratio.detach()[:, None] + logp - logp.detach()
    return _clipped_surrogate(token_log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT),
                              adv[:, None], clip_low, clip_high)


@register_policy_loss("cispo")
def cispo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float,
               clip_high: float) -> PolicyLoss:
    """CISPO: the clipped importance weight, detached, times the advantage and log-prob."""
    ratio = torch.exp(_log_ratio(logp, old_logp))
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    return PolicyLoss(-weight * adv[:, None] * logp, (weight != ratio.detach()).float())


# -- reward shaping ------------------------------------------------------------------------
def overlong_penalty(lengths: Tensor, max_tokens: int, buffer_tokens: int,
                     penalty: float) -> Tensor:
    """DAPO soft overlong punishment: 0 until max - buffer, then linear down to -penalty."""
    start = max_tokens - buffer_tokens
    over = (lengths.float() - start).clamp(min=0.0)
    return -(over / buffer_tokens).clamp(max=1.0) * penalty
