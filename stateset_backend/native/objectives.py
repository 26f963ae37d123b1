"""The RL math, as registries of small pure tensor functions.

Each advantage baseline, advantage normaliser, policy loss, KL estimator and loss
aggregation is one decorated function of tensors, looked up by name, so a new objective is one
function and each can be tested alone on hand-computed values. Nothing here reads a config
object: every knob is an argument.

Where an objective carries a verl name, its numbers are verl 0.9.1's
``verl.trainer.ppo.core_algos`` (values and gradients; ``tests/engines/test_native_vs_verl.py``
proves it), with the spec's knobs (``dual_clip``, ``kl.clamp``, ``advantage.scope``) set to
the values verl hard-codes.

Shapes: ``B`` samples, ``T`` response tokens. ``mask`` is 1.0 on sampled tokens, 0.0 after.
Advantages are one per sample ``[B]`` or, for conversations, one per token ``[B, T]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

# verl clamps token log-ratios to [-20, 20] before exp (vanilla, CISPO, k3's inner term) and a
# GSPO sequence log-ratio to at most 10: one extreme token cannot overflow a whole batch.
LOG_RATIO_LIMIT = 20.0
GSPO_LOG_RATIO_MAX = 10.0

F = TypeVar("F")
BaselineFn = Callable[[Tensor, Tensor], Tensor]
NormaliserFn = Callable[..., Tensor]
PolicyLossFn = Callable[..., "PolicyLoss"]
KLFn = Callable[[Tensor, Tensor], Tensor]
AggregationFn = Callable[[Tensor, Tensor, int], Tensor]

ADVANTAGES: dict[str, BaselineFn] = {}
NORMALISERS: dict[str, NormaliserFn] = {}
POLICY_LOSSES: dict[str, PolicyLossFn] = {}
KL_ESTIMATORS: dict[str, KLFn] = {}
AGGREGATIONS: dict[str, AggregationFn] = {}


def _registrar(registry: dict[str, F], name: str) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        registry[name] = fn
        return fn

    return deco


def register_advantage(name: str) -> Callable[[BaselineFn], BaselineFn]:
    return _registrar(ADVANTAGES, name)


def register_normaliser(name: str) -> Callable[[NormaliserFn], NormaliserFn]:
    return _registrar(NORMALISERS, name)


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    return _registrar(POLICY_LOSSES, name)


def register_kl(name: str) -> Callable[[KLFn], KLFn]:
    return _registrar(KL_ESTIMATORS, name)


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    return _registrar(AGGREGATIONS, name)


# objective -> (advantage baseline, policy loss); the normaliser is the spec's advantage.scope
RECIPES: dict[str, tuple[str, str]] = {
    "grpo": ("group", "clipped"),
    "dr_grpo": ("group", "clipped"),
    "dapo": ("group", "clipped"),
    "gspo": ("group", "gspo"),
    "cispo": ("group", "cispo"),
    "rloo": ("leave_one_out", "clipped"),
    "reinforce_pp": ("group", "clipped"),
    # "gae": token advantages from a learned critic (CRITIC_ESTIMATORS), not a baseline
    "ppo": ("gae", "clipped"),
}


# -- groups --------------------------------------------------------------------------------
def _group_sum(values: Tensor, group_ids: Tensor, n_groups: int) -> Tensor:
    return torch.zeros(n_groups, dtype=values.dtype).index_add_(0, group_ids, values)


def _group_stats(rewards: Tensor, group_ids: Tensor, unbiased: bool) -> tuple[Tensor, Tensor,
                                                                               Tensor]:
    """Per-sample group mean, group std and group size (via scatter, no Python loop)."""
    n_groups = int(group_ids.max().item()) + 1
    count = _group_sum(torch.ones_like(rewards), group_ids, n_groups)
    mean = _group_sum(rewards, group_ids, n_groups) / count
    centered = rewards - mean[group_ids]
    sq = _group_sum(centered ** 2, group_ids, n_groups)
    denom = (count - 1).clamp(min=1) if unbiased else count
    std = (sq / denom).sqrt()
    return mean[group_ids], std[group_ids], count[group_ids]


def zero_variance_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Boolean per sample: its group's rewards are all exactly equal, as given (no learning
    signal). Exact comparison, never a std threshold: equal rewards that the dtype cannot
    represent exactly (0.1 in float32) still have a mean that rounds away from them."""
    n_groups = int(group_ids.max().item()) + 1
    hi = torch.full((n_groups,), -torch.inf, dtype=rewards.dtype).scatter_reduce(
        0, group_ids, rewards, reduce="amax")
    lo = torch.full((n_groups,), torch.inf, dtype=rewards.dtype).scatter_reduce(
        0, group_ids, rewards, reduce="amin")
    count = _group_sum(torch.ones_like(rewards), group_ids, n_groups)
    return ((hi == lo) & (count > 1))[group_ids]  # a group of one compares with nothing


# -- advantage baselines (one centred scalar per sample) -----------------------------------
@register_advantage("group")
def group_baseline(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """GRPO / REINFORCE++-baseline: reward minus the group mean. A group of one has no
    baseline (verl's rule): REINFORCE++ with one sample per prompt is plain REINFORCE++,
    whitened over the batch."""
    mean, _, count = _group_stats(rewards, group_ids, unbiased=True)
    return rewards - torch.where(count > 1, mean, torch.zeros_like(mean))


@register_advantage("leave_one_out")
def leave_one_out_baseline(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: reward minus the mean of the *other* samples of the group (verl's form:
    r n/(n-1) - mean n/(n-1)); a group of one keeps its reward."""
    mean, _, count = _group_stats(rewards, group_ids, unbiased=True)
    scale = torch.where(count > 1, count / (count - 1).clamp(min=1), 1.0)
    return torch.where(count > 1, rewards * scale - mean * scale, rewards)


# -- advantage normalisers, by advantage.scope ---------------------------------------------
@register_normaliser("group")
def group_std_normaliser(centred: Tensor, rewards: Tensor, group_ids: Tensor,
                         token_counts: Tensor, *, unbiased: bool, eps: float,
                         eps_on_variance: bool = False) -> Tensor:
    """Divide by the std of the group's rewards plus eps (GRPO)."""
    _, std, _ = _group_stats(rewards, group_ids, unbiased)
    scale = (std * std + eps).sqrt() if eps_on_variance else std + eps
    return centred / scale


@register_normaliser("batch")
def batch_whitening(centred: Tensor, rewards: Tensor, group_ids: Tensor, token_counts: Tensor,
                    *, unbiased: bool, eps: float, eps_on_variance: bool = False) -> Tensor:
    """Whiten over the batch's response tokens (REINFORCE++-baseline, verl's masked_whiten):
    each sample counts once per token it generated; subtract the mean, divide by the std.

    ``unbiased`` divides the variance by N-1 with N the number of tokens. verl adds 1e-8 to
    the variance (``eps_on_variance=True, eps=1e-8``); the spec adds epsilon to the std.
    """
    w = token_counts.to(centred.dtype)
    n = w.sum()
    mean = (centred * w).sum() / n
    var = ((centred - mean) ** 2 * w).sum() / n
    if unbiased:
        var = var * n / (n - 1).clamp(min=1)
    scale = (var + eps).sqrt() if eps_on_variance else var.sqrt() + eps
    return (centred - mean) / scale


def advantages(rewards: Tensor, group_ids: Tensor, token_counts: Tensor, *, baseline: str,
               std_normalize: bool, scope: str, unbiased: bool, eps: float,
               eps_on_variance: bool = False) -> Tensor:
    """One advantage per sample: baseline, then (optionally) the scope's normalisation.

    A group whose rewards are all equal has a centred advantage of exactly 0 whatever the
    rewards' dtype; with group scope it stays 0, with batch scope it is shifted by the batch
    mean like every other sample.
    """
    centred = ADVANTAGES[baseline](rewards, group_ids)
    centred = torch.where(zero_variance_groups(rewards, group_ids),
                          torch.zeros_like(centred), centred)
    if not std_normalize:
        return centred
    return NORMALISERS[scope](centred, rewards, group_ids, token_counts, unbiased=unbiased,
                              eps=eps, eps_on_variance=eps_on_variance)


# -- KL estimators (per token), verl's kl / mse / low_var_kl -------------------------------
@register_kl("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """d = log pi - log pi_ref (verl ``kl``)."""
    return logp - ref_logp


@register_kl("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """d^2 / 2 (verl ``mse``)."""
    return 0.5 * (logp - ref_logp).square()


@register_kl("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """exp(-d) - 1 + d with -d clamped to [-20, 20] before exp (verl ``low_var_kl``)."""
    x = (ref_logp - logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(x) - x - 1


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str,
                clamp: float | None = None) -> Tensor:
    """KL(pi || pi_ref) per token from samples of pi, clamped to [-clamp, clamp] when set
    (verl hard-codes 10 for k3 and nothing for k1/k2)."""
    kl = KL_ESTIMATORS[estimator](logp, ref_logp)
    return kl if clamp is None else kl.clamp(-clamp, clamp)


# -- aggregation ---------------------------------------------------------------------------
@register_aggregation("token_mean")
def token_mean(values: Tensor, mask: Tensor, max_tokens: int) -> Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(values: Tensor, mask: Tensor, max_tokens: int) -> Tensor:
    lengths = mask.sum(-1)
    per_seq = (values * mask).sum(-1) / lengths.clamp(min=1.0)
    return per_seq.sum() / (lengths > 0).sum().clamp(min=1)


@register_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(values: Tensor, mask: Tensor, max_tokens: int) -> Tensor:
    return (values * mask).sum() / (mask.sum(-1) > 0).sum().clamp(min=1)


@register_aggregation("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(values: Tensor, mask: Tensor, max_tokens: int) -> Tensor:
    """Dr.GRPO: token sums averaged over sequences, over a constant ``max_tokens`` (the
    response budget; verl's ``loss_scale_factor``, which falls back to the padded width)."""
    return seq_mean_token_sum(values, mask, max_tokens) / max_tokens


def aggregate(values: Tensor, mask: Tensor, mode: str, max_tokens: int) -> Tensor:
    """Token values [B, T] -> one scalar, by the spec's loss aggregation."""
    return AGGREGATIONS[mode](values, mask, max_tokens)


# What each aggregation divides by. Data-parallel ranks each hold part of a mini-batch; a rank
# that scales its local aggregate by (its units / the global units) contributes exactly its
# share of the global aggregate, so the ranks' summed gradients equal one process's.
AGGREGATION_UNITS: dict[str, str] = {
    "token_mean": "tokens",
    "seq_mean_token_mean": "sequences",
    "seq_mean_token_sum": "sequences",
    "seq_mean_token_sum_norm": "sequences",
}
UNIT_ORDER = ("tokens", "sequences")


def aggregation_units(mask: Tensor) -> Tensor:
    """[tokens, sequences with at least one token] of a mask, as float64 (summed over ranks)."""
    return torch.stack([mask.sum(), (mask.sum(-1) > 0).sum()]).double()


def local_share(local: Tensor, total: Tensor, mode: str) -> float:
    """This rank's weight on its local aggregate under ``mode``: 1.0 exactly in one process."""
    i = UNIT_ORDER.index(AGGREGATION_UNITS[mode])
    return float(local[i]) / float(total[i]) if float(total[i]) > 0 else 0.0


# -- policy losses (per token) -------------------------------------------------------------
def _per_token(adv: Tensor) -> Tensor:
    """[B] sample advantages broadcast over tokens; [B, T] token advantages as they are."""
    return adv[:, None] if adv.dim() == 1 else adv


@dataclass(frozen=True)
class PolicyLoss:
    loss: Tensor  # [B, T] per-token loss, to be aggregated
    clipped: Tensor  # [B, T] 1.0 where clipping changed the objective


def _clipped_surrogate(ratio: Tensor, adv: Tensor, low: float, high: float) -> tuple[Tensor,
                                                                                      Tensor]:
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


@register_policy_loss("clipped")
def clipped_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float,
                 clip_high: float, dual_clip: float | None = None) -> PolicyLoss:
    """PPO's clipped surrogate per token (verl ``vanilla``); asymmetric when clip_low !=
    clip_high (DAPO). With ``dual_clip`` c > 1, a token with a negative advantage loses at
    most -A*c (Ye et al. 2020; verl's clip_ratio_c)."""
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    a = _per_token(adv)
    loss, clipped = _clipped_surrogate(ratio, a, clip_low, clip_high)
    if dual_clip is not None:
        loss = torch.where(a < 0, torch.minimum(-a * dual_clip, loss), loss)
    return PolicyLoss(loss, clipped)


@register_policy_loss("gspo")
def gspo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float,
              clip_high: float) -> PolicyLoss:
    """GSPO: one ratio per sequence, exp of the length-normalised log-prob difference.

    Written in the GSPO-token form (sg(s_i) + log pi_t - sg(log pi_t)) so the value is the
    sequence ratio while the gradient flows through every token; the log-ratio is capped at
    10 before exp, as verl does.
    """
    lengths = mask.sum(-1).clamp(min=1.0)
    seq_log_ratio = ((logp - old_logp) * mask).sum(-1) / lengths
    token_log_ratio = logp - logp.detach() + seq_log_ratio.detach()[:, None]
    ratio = torch.exp(token_log_ratio.clamp(max=GSPO_LOG_RATIO_MAX))
    loss, clipped = _clipped_surrogate(ratio, _per_token(adv), clip_low, clip_high)
    return PolicyLoss(loss, clipped)


@register_policy_loss("cispo")
def cispo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, *, clip_low: float,
               clip_high: float) -> PolicyLoss:
    """CISPO: the clipped importance weight, detached, times the advantage and log-prob."""
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return PolicyLoss(-weight.detach() * _per_token(adv) * logp, (ratio != weight).float())


def rollout_weights(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, mode: str,
                    low: float, high: float) -> Tensor:
    """[B, T] factors on each token's policy-gradient term (algorithm.rollout_correction;
    OpenRLHF's tis, icepop and seq-mask-tis): a sampler whose log-probs differ from the
    learner's draws slightly off-policy samples, and w = exp(old - rollout) reweights them.
    Detached, since it corrects the data rather than being learned through; 0 off the mask,
    so an unsampled position cannot turn a product into NaN."""
    log_w = torch.where(mask > 0, old_logp - rollout_logp, 0.0).detach()
    w = torch.exp(log_w)
    if mode == "truncate":
        w = w.clamp(low, high)
    elif mode == "mask":
        w = torch.where((w >= low) & (w <= high), w, 0.0)
    elif mode == "sequence_mask":
        seq = torch.exp((log_w * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))
        w = torch.where(((seq >= low) & (seq <= high))[:, None], w, 0.0)
    else:
        raise ValueError(f"no rollout correction mode {mode!r}")
    return torch.where(mask > 0, w, 0.0)


# -- reward shaping ------------------------------------------------------------------------
def overlong_penalty(lengths: Tensor, max_tokens: int, buffer_tokens: int,
                     penalty: float) -> Tensor:
    """DAPO soft overlong punishment: 0 until max - buffer, then linear down to -penalty at
    the hard limit (verl's DAPO reward manager: min(-(len - (max - buffer)) / buffer * p, 0))."""
    exceed = lengths.double() - (max_tokens - buffer_tokens)
    return (-exceed / buffer_tokens * penalty).clamp(min=-penalty, max=0.0)


# -- conversations -------------------------------------------------------------------------
def reward_to_go(turn_rewards: Tensor, gamma: float) -> Tensor:
    """G_t = sum_{k >= t} gamma^(k-t) r_k per conversation; ``turn_rewards`` is [B, K] with NaN
    past a conversation's last turn, and so is the result."""
    r = torch.nan_to_num(turn_rewards.double(), nan=0.0)
    out = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=r.dtype)
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return torch.where(torch.isnan(turn_rewards), torch.nan, out).to(turn_rewards.dtype)


def conversation_return(turn_rewards: Tensor, placement: str, gamma: float) -> Tensor:
    """One number per conversation: the last step's reward (final) or G_0 (per_turn)."""
    if placement == "final":
        last = (~torch.isnan(turn_rewards)).sum(-1) - 1
        return turn_rewards.gather(1, last.clamp(min=0)[:, None]).squeeze(1)
    return reward_to_go(turn_rewards, gamma)[:, 0]


def conversation_advantages(turn_rewards: Tensor, turn_ids: Tensor, loss_mask: Tensor,
                            group_ids: Tensor, *, placement: str, gamma: float, baseline: str,
                            std_normalize: bool, scope: str, unbiased: bool,
                            eps: float) -> Tensor:
    """Token advantages [B, L] of whole conversations, 0 wherever no loss is carried.

    final: the objective's advantage of each conversation's final reward, on every assistant
    token (exactly the single-turn formula, with a conversation as the sample).
    per_turn: the objective's baseline b_i comes from the returns G_0 of the group's
    conversations (b_i = G_0,i - centred_i: the group mean, or the mean of the others for
    leave-one-out); turn t's tokens get G_t,i - b_i. With std normalisation that is divided by
    the group's std of G_0 plus eps (group scope), or whitened over the batch's assistant tokens
    (batch scope). A group whose returns G_0 are all equal has advantage 0 on every turn, as
    zero-variance groups do everywhere.
    """
    if placement == "final":
        rewards = conversation_return(turn_rewards, "final", gamma)
        adv = advantages(rewards, group_ids, loss_mask.sum(-1), baseline=baseline,
                         std_normalize=std_normalize, scope=scope, unbiased=unbiased, eps=eps)
        return adv[:, None] * loss_mask
    to_go = reward_to_go(turn_rewards, gamma)
    g0 = to_go[:, 0]
    centred = ADVANTAGES[baseline](g0, group_ids)
    base = g0 - centred
    index = turn_ids.clamp(min=0)
    values = (torch.nan_to_num(to_go, nan=0.0).gather(1, index) - base[:, None]) * loss_mask
    values = torch.where(zero_variance_groups(g0, group_ids)[:, None],
                         torch.zeros_like(values), values)
    if not std_normalize:
        return values
    if scope == "group":
        _, std, _ = _group_stats(g0, group_ids, unbiased)
        return values / (std + eps)[:, None]
    flat = values[loss_mask.bool()]
    whitened = batch_whitening(flat, flat, torch.zeros_like(flat, dtype=torch.long),
                               torch.ones_like(flat), unbiased=unbiased, eps=eps)
    out = torch.zeros_like(values)
    out[loss_mask.bool()] = whitened
    return out


# -- PPO with a learned critic -------------------------------------------------------------
def outcome_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """[B] sequence rewards -> [B, T] token rewards: each on its sample's last response token
    (where verl's reward manager puts it), 0 elsewhere."""
    last = (mask.sum(-1) - 1).clamp(min=0).long()
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    return out.scatter(1, last[:, None], rewards[:, None])


def gae_advantages_returns(token_rewards: Tensor, values: Tensor, mask: Tensor, *,
                           gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Token-level GAE: (advantages, returns), each [B, T], before any normalisation.

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, where t+1
    is the next token that carries the mask (masked positions are skipped, not zeroed), and the
    value of the state after a sample's last token is 0. Returns are A + V: the critic's
    regression targets. Equals verl's compute_gae_advantage_return before its whitening.
    """
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    out = torch.zeros_like(values)
    for t in range(values.shape[1] - 1, -1, -1):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        next_value = values[:, t] * m + (1 - m) * next_value
        running = step * m + (1 - m) * running
        out[:, t] = running
    return out, out + values


def whiten_tokens(values: Tensor, mask: Tensor, *, unbiased: bool, eps: float,
                  eps_on_variance: bool = False) -> Tensor:
    """Subtract the mean over masked tokens and divide by their std (+ eps): PPO's batch-scope
    advantage normalisation. verl's masked_whiten is ``unbiased, eps=1e-8,
    eps_on_variance=True``; the spec adds its epsilon to the std."""
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = ((values - mean) ** 2 * mask).sum() / n
    if unbiased:
        var = var * n / (n - 1).clamp(min=1)
    scale = (var + eps).sqrt() if eps_on_variance else var.sqrt() + eps
    return (values - mean) / scale


# advantage estimators that bootstrap from a learned critic, by RECIPES name
CRITIC_ESTIMATORS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "gae": gae_advantages_returns}


@dataclass(frozen=True)
class ValueLoss:
    loss: Tensor  # scalar: 0.5 * the aggregated squared error
    clipped: Tensor  # [B, T] 1.0 where the clipped error was the larger


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *,
               clip: float | None, aggregation: str, max_tokens: int) -> ValueLoss:
    """PPO's value loss: 0.5 * aggregate(max((V - R)^2, (V_clip - R)^2)) with V_clip = V_old +
    clamp(V - V_old, -clip, clip), V_old the value recorded at rollout; ``clip`` None is the
    plain 0.5 * (V - R)^2. verl's compute_value_loss (its critic aggregates like the actor)."""
    plain = (values - returns) ** 2
    if clip is None:
        return ValueLoss(0.5 * aggregate(plain, mask, aggregation, max_tokens),
                         torch.zeros_like(plain))
    clipped_values = torch.minimum(torch.maximum(values, old_values - clip), old_values + clip)
    clipped = (clipped_values - returns) ** 2
    return ValueLoss(0.5 * aggregate(torch.maximum(plain, clipped), mask, aggregation,
                                     max_tokens), (clipped > plain).float())

