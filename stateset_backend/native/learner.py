"""The learner: advantages, PPO epochs over mini-batches, and guarded optimizer steps.

An optimizer step whose loss or gradient is not finite is never applied: the run stops with
the reason, because a NaN that is stepped over poisons every later update while the run keeps
reporting numbers.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stateset_backend.native import objectives
from stateset_backend.native.batch import ConversationBatch, RolloutBatch
from stateset_backend.native.multiturn.conversation import conversation_logprobs
from stateset_backend.native.parallel.distributed import World, all_reduce_gradients
from stateset_backend.native.rollout import response_logprobs, response_token_logprobs
from stateset_backend.spec.model import Algorithm, Environment, Optim
from stateset_backend.spec.schedule import lr_factor

Batch = RolloutBatch | ConversationBatch


class NonFiniteUpdate(RuntimeError):
    """A loss or gradient was NaN/Inf; the step was not applied."""


@dataclass(frozen=True)
class LearnerConfig:
    algorithm: Algorithm
    temperature: float
    max_response_tokens: int  # conversations: max_turns * the turn limit
    ppo_epochs: int
    mini_batches: int
    grad_clip: float
    compute: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def make_optimizer(model: Any, optim: Optim, total_updates: int) -> tuple[torch.optim.Optimizer,
                                                                          Any]:
    """AdamW over the trainable parameters; the scheduler advances once per update."""
    if optim.kind != "adamw":
        raise ValueError(f"the native engine has no optimizer {optim.kind!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    # the fused kernel: one pass over all parameters instead of a dozen small ops per tensor
    # (4x faster a step on the CPU); the same update rule, where the device and dtype have it
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype in FUSED_DTYPES for p in params)
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, eps=optim.eps,
                                  weight_decay=optim.weight_decay, fused=fused or None)
    schedule = functools.partial(lr_factor, schedule=optim.schedule, warmup=optim.warmup_steps,
                                 total=total_updates, min_lr_ratio=optim.min_lr_ratio,
                                 warmup_start=optim.warmup_start_ratio)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def advantages_for(batch: Batch, algorithm: Algorithm,
                   environment: Environment | None = None) -> Tensor:
    """One advantage per sample, or per token for conversations (objectives has the rules)."""
    baseline, _ = objectives.RECIPES[algorithm.objective]
    adv = algorithm.advantage
    if isinstance(batch, ConversationBatch):
        env = environment or Environment()
        return objectives.conversation_advantages(
            batch.turn_rewards, batch.turn_ids, batch.loss_mask, batch.group_ids,
            placement=env.reward_placement, gamma=env.turn_discount, baseline=baseline,
            std_normalize=adv.std_normalize, scope=adv.scope, unbiased=adv.std == "unbiased",
            eps=adv.epsilon)
    return objectives.advantages(
        batch.rewards, batch.group_ids, batch.response_mask.sum(-1), baseline=baseline,
        std_normalize=adv.std_normalize, scope=adv.scope,
        unbiased=adv.std == "unbiased", eps=adv.epsilon)


def gae_targets(batch: RolloutBatch, algorithm: Algorithm,
                token_penalty: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """PPO's (advantages, returns), each [B, T] and 0 off the mask, from the batch's rewards
    and the critic values recorded at rollout. The reward sits on the last token; a KL penalty
    placed in the reward (``token_penalty``, [B, T]) is subtracted token by token, as verl
    does. Computed in float64; with std_normalize the advantages are whitened over the batch's
    tokens (advantage.std, advantage.epsilon)."""
    gae, adv = algorithm.gae, algorithm.advantage
    assert gae is not None and batch.values is not None
    if adv.scope != "batch":
        raise ValueError("PPO advantages are per token and normalised over the batch: "
                         "advantage.scope must be 'batch'")
    mask = batch.response_mask.double()
    rewards = objectives.outcome_token_rewards(batch.rewards.double(), mask)
    if token_penalty is not None:
        rewards = rewards - token_penalty.double() * mask
    values = torch.nan_to_num(batch.values.double(), nan=0.0)
    estimator = objectives.CRITIC_ESTIMATORS[objectives.RECIPES[algorithm.objective][0]]
    advantages, returns = estimator(rewards, values, mask, gamma=gae.gamma, lam=gae.lam)
    if adv.std_normalize:
        advantages = objectives.whiten_tokens(advantages, mask, unbiased=adv.std == "unbiased",
                                              eps=adv.epsilon)
    return (advantages * mask).float(), (returns * mask).float()


@contextlib.contextmanager
def _reference_mode(model: Any, reference: Any) -> Iterator[Any]:
    if reference is not None:
        yield reference
    else:  # LoRA: the base weights are the reference
        with model.disable_adapter():
            yield model


def policy_logprobs(model: Any, batch: Batch, idx: Tensor, temperature: float,
                    group_size: int) -> tuple[Tensor, Tensor]:
    """(log-prob, entropy) per token of rows ``idx``, aligned with the batch's loss mask."""
    if isinstance(batch, ConversationBatch):
        return conversation_logprobs(model, batch.ids[idx], batch.attention[idx], temperature)
    return response_logprobs(model, batch.prompt_ids[idx], batch.prompt_mask[idx],
                             batch.response_ids[idx], batch.response_mask[idx], temperature,
                             group_size)


@torch.no_grad()
def frozen_logprobs(model: Any, batch: Batch, temperature: float, group_size: int) -> Tensor:
    """Log-prob of each token of the whole batch under ``model`` as it stands, no gradients."""
    if isinstance(batch, ConversationBatch):
        logp, _ = policy_logprobs(model, batch, torch.arange(batch.size), temperature,
                                  group_size)
        return logp
    return response_token_logprobs(model, batch.prompt_ids, batch.prompt_mask,
                                   batch.response_ids, batch.response_mask, temperature,
                                   group_size)


@torch.no_grad()
def reference_logprobs(model: Any, reference: Any, batch: Batch, temperature: float,
                       group_size: int) -> Tensor:
    with _reference_mode(model, reference) as ref:
        return frozen_logprobs(ref, batch, temperature, group_size)


def corrected_old_logprobs(model: Any, batch: Batch, cfg: LearnerConfig) -> tuple[Tensor,
                                                                                  Tensor]:
    """(old log-probs, rollout-correction weights) under algorithm.rollout_correction.

    The learner's own log-probs under the weights that sampled, taken before any optimizer
    step of the update, become the ratios' denominator, and the sampler's recorded ones enter
    only through the weights: with the sampler's as denominator the mismatch would be counted
    twice, once in the ratio and once in the weight."""
    rc = cfg.algorithm.rollout_correction
    assert rc is not None
    with cfg.compute():
        old = frozen_logprobs(model, batch, cfg.temperature, cfg.algorithm.group_size)
    old = old.to(batch.sample_logprobs.dtype)
    rollout = torch.nan_to_num(batch.sample_logprobs, nan=0.0)
    weights = objectives.rollout_weights(old, rollout, batch.response_mask, mode=rc.mode,
                                         low=rc.low, high=rc.high)
    return torch.where(batch.response_mask > 0, old, rollout), weights


def split_groups(batch: Batch, group_size: int, parts: int, generator: torch.Generator, *,
                 n_groups: int | None = None, owned: range | None = None) -> list[Tensor]:
    """Mini-batches of whole groups (row indices), so each keeps its shared prompt prefill.
    Conversation groups may have lost failed members, so they are found by id.

    Data parallel: ``n_groups`` is the update's global group count and ``owned`` this rank's
    block of it. Every rank draws the same permutation, so each mini-batch is the 1-process
    mini-batch and a rank gets its own groups of it (possibly none: it still takes part in
    the step)."""
    if n_groups is None:
        n_groups = int(batch.group_ids.max().item()) + 1
    order = torch.randperm(n_groups, generator=generator)
    if isinstance(batch, ConversationBatch):
        return [torch.isin(batch.group_ids, chunk).nonzero().squeeze(-1)
                for chunk in order.chunk(parts) if chunk.numel()]
    offsets = torch.arange(group_size)
    out = []
    for chunk in order.chunk(parts):
        if not chunk.numel():
            continue
        if owned is not None:
            chunk = chunk[(chunk >= owned.start) & (chunk < owned.stop)] - owned.start
        out.append((chunk[:, None] * group_size + offsets).flatten())
    return out


def _times(value: Tensor, share: float) -> Tensor:
    """``value * share``; one process's share is exactly 1, whose product is ``value`` itself
    (and whose gradient is the gradient), so no operator is spent on it."""
    return value if share == 1.0 else value * share


def _correction_metrics(weights: Tensor, mask: Tensor, world: World) -> dict[str, float]:
    """How far the sampler strayed, over every rank's response tokens: the mean weight, and
    the share of tokens the mode dropped (weight 0) and so learned nothing from."""
    sums = torch.stack([(weights * mask).sum(), ((weights == 0) & (mask > 0)).sum(),
                        mask.sum()]).double()
    if world.parallel:
        world.all_reduce(sums)
    tokens = max(float(sums[2]), 1.0)
    return {"rollout_correction/weight_mean": float(sums[0]) / tokens,
            "rollout_correction/filtered_share": float(sums[1]) / tokens}


def update(model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, batch: Batch,
           advantages: Tensor, ref_logp: Tensor | None, cfg: LearnerConfig,
           generator: torch.Generator, *, world: World | None = None,
           n_groups: int | None = None, owned: range | None = None) -> dict[str, float]:
    """One learner update over a checked batch; returns canonical metrics.

    Data parallel (``world``, with the update's global ``n_groups`` and this rank's ``owned``
    block): each rank weights its local aggregates by its share of the global token or
    sequence count (objectives.AGGREGATION_UNITS), the weighted losses and gradients are summed
    over ranks, and clipping and the step then see the 1-process gradient on every rank."""
    world = world or World()
    alg = cfg.algorithm
    _, loss_name = objectives.RECIPES[alg.objective]
    loss_fn = objectives.POLICY_LOSSES[loss_name]
    kl_in_loss = alg.kl is not None and alg.kl.placement == "loss"
    loss_knobs = {"dual_clip": alg.clip.dual_clip} if loss_name == "clipped" else {}
    old_logp = torch.nan_to_num(batch.sample_logprobs, nan=0.0)
    if not model.training:  # the engine sets the whole model's mode; setting it walks it all
        model.train()
    weights = None
    if alg.rollout_correction is not None:
        old_logp, weights = corrected_old_logprobs(model, batch, cfg)
    totals = {"loss/policy": 0.0, "kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0,
              "grad_norm": 0.0}
    steps = 0
    params = [p for p in model.parameters() if p.requires_grad]
    group_size = alg.group_size
    agg = alg.loss_aggregation
    for _ in range(cfg.ppo_epochs):
        for idx in split_groups(batch, group_size, cfg.mini_batches, generator,
                                n_groups=n_groups, owned=owned):
            mask = batch.response_mask[idx]
            local_units = objectives.aggregation_units(mask)
            units = world.all_reduce(local_units.clone()) if world.parallel else local_units
            share = objectives.local_share(local_units, units, agg)
            token_share = objectives.local_share(local_units, units, "token_mean")
            optimizer.zero_grad(set_to_none=True)
            loss: Tensor = torch.zeros(())
            # [loss, policy, kl, entropy, clip fraction], each this rank's share of the global
            stats = torch.zeros(5, dtype=torch.float64)
            if idx.numel():
                with cfg.compute():
                    logp, entropy = policy_logprobs(model, batch, idx, cfg.temperature,
                                                    group_size)
                pl = loss_fn(logp, old_logp[idx], advantages[idx], mask,
                             clip_low=alg.clip.low, clip_high=alg.clip.high, **loss_knobs)
                pg_tokens = pl.loss if weights is None else pl.loss * weights[idx]
                policy_loss = _times(objectives.aggregate(pg_tokens, mask, agg,
                                                          cfg.max_response_tokens), share)
                loss = policy_loss
                kl_value = torch.zeros(())
                if ref_logp is not None and alg.kl is not None:
                    kl_tokens = objectives.kl_estimate(logp, ref_logp[idx], alg.kl.estimator,
                                                       alg.kl.clamp)
                    kl_value = _times(objectives.aggregate(kl_tokens, mask, agg,
                                                           cfg.max_response_tokens), share)
                    if kl_in_loss:
                        loss = loss + alg.kl.coef * kl_value
                mean_entropy = _times(objectives.aggregate(entropy, mask, "token_mean", 1),
                                      token_share)
                if alg.entropy_coef > 0:
                    loss = loss - alg.entropy_coef * mean_entropy
                clipped = _times(objectives.aggregate(pl.clipped, mask, "token_mean", 1),
                                 token_share)
                stats = torch.stack([loss.detach(), policy_loss.detach(), kl_value.detach(),
                                     mean_entropy.detach(), clipped.detach()]).double()
            world.all_reduce(stats)
            if not torch.isfinite(stats[0]):
                raise NonFiniteUpdate(f"loss is {stats[0].item()}; the step was not applied")
            if idx.numel():
                loss.backward()
            all_reduce_gradients(params, world)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            if not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteUpdate(f"gradient norm is {grad_norm.item()}; the step was not "
                                      "applied")
            optimizer.step()
            steps += 1
            for name, value in zip(("loss/policy", "kl", "entropy", "clip_fraction"),
                                   stats[1:].tolist(), strict=True):
                totals[name] += value
            totals["grad_norm"] += float(grad_norm)
    metrics = {k: v / max(steps, 1) for k, v in totals.items()}
    metrics["lr"] = float(scheduler.get_last_lr()[0])
    if weights is not None:
        metrics.update(_correction_metrics(weights, batch.response_mask, world))
    scheduler.step()  # once per update, not per optimizer step
    assert all(math.isfinite(v) for v in metrics.values())
    return metrics
