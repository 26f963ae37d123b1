"""PPO's learned critic: a separate value model, its values at rollout, and its update.

The critic is a second copy of the policy's network (same ``model.path`` and revision, same
seeded initialisation for the built-in model) whose last hidden state feeds a scalar value
head, as verl's and OpenRLHF's critics are. Its values for a batch are computed once, right
after the batch is sampled and before anything learns from it, and travel with the batch: the
value loss clips against exactly those values, and GAE bootstraps from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from stateset_backend.native import objectives
from stateset_backend.native.batch import RolloutBatch, check_returns
from stateset_backend.native.learner import (
    LearnerConfig,
    NonFiniteUpdate,
    gae_targets,
    make_optimizer,
    split_groups,
    update,
)
from stateset_backend.native.model import load_policy
from stateset_backend.native.rollout import positions_from_mask
from stateset_backend.spec.model import ExperimentSpec


class ValueModel(nn.Module):
    """The policy's trunk (without its LM head) and a scalar value head on its last hidden
    state. ``values`` gives V(s_t) for each response token t: the value of the state the token
    was sampled from (prompt and the response before it)."""

    def __init__(self, causal_lm: Any) -> None:
        super().__init__()
        self.trunk = causal_lm.base_model
        hidden = int(causal_lm.config.hidden_size)
        self.head = nn.Linear(hidden, 1, dtype=next(self.trunk.parameters()).dtype)
        nn.init.zeros_(self.head.weight)  # V = 0 everywhere until the critic has learned
        nn.init.zeros_(self.head.bias)

    def values(self, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
               response_mask: Tensor) -> Tensor:
        """[B, T] values, float32; the state before response token t ends at position P-1+t."""
        ids = torch.cat([prompt_ids, response_ids], dim=1)
        mask = torch.cat([prompt_mask, response_mask], dim=1).long()
        hidden = self.trunk(input_ids=ids, attention_mask=mask,
                            position_ids=positions_from_mask(mask)).last_hidden_state
        p, t = prompt_ids.shape[1], response_ids.shape[1]
        return self.head(hidden[:, p - 1:p - 1 + t]).squeeze(-1).float()


@dataclass
class Critic:
    """The value model with its own optimizer and LR schedule (critic.lr; optim's other
    settings), checkpointed and resumed alongside the policy."""

    model: ValueModel
    optimizer: torch.optim.Optimizer
    scheduler: Any


def load_critic(spec: ExperimentSpec, base_dir: Path, device: torch.device) -> Critic:
    assert spec.algorithm.gae is not None
    causal, _ = load_policy(spec.model.model_copy(update={"lora": None}), spec.seed, base_dir,
                            device)
    model = ValueModel(causal).to(device)
    optim = spec.optim.model_copy(update={"lr": spec.algorithm.gae.critic.lr})
    optimizer, scheduler = make_optimizer(model, optim, spec.budget.total_updates)
    return Critic(model, optimizer, scheduler)


@torch.no_grad()
def rollout_values(critic: Critic, batch: RolloutBatch) -> Tensor:
    """The critic's values for a freshly sampled batch, NaN where no token was sampled."""
    critic.model.eval()
    device = next(critic.model.parameters()).device
    values = critic.model.values(batch.prompt_ids.to(device), batch.prompt_mask.to(device),
                                 batch.response_ids.to(device), batch.response_mask.to(device))
    values = values.cpu()
    return torch.where(batch.response_mask.bool(), values, torch.full_like(values, math.nan))


def update_critic(critic: Critic, batch: RolloutBatch, returns: Tensor, cfg: LearnerConfig,
                  generator: torch.Generator, *, value_clip: float | None) -> dict[str, float]:
    """ppo_epochs x mini_batches optimizer steps on the value loss; the schedule advances once
    per update. A non-finite loss or gradient is never applied."""
    assert batch.values is not None
    old_values = torch.nan_to_num(batch.values, nan=0.0)
    model, device = critic.model, next(critic.model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    totals = {"loss/value": 0.0, "value/clip_fraction": 0.0, "value/grad_norm": 0.0}
    steps = 0
    for _ in range(cfg.ppo_epochs):
        for idx in split_groups(batch, cfg.algorithm.group_size, cfg.mini_batches, generator):
            mask = batch.response_mask[idx]
            with cfg.compute():
                values = model.values(batch.prompt_ids[idx].to(device),
                                      batch.prompt_mask[idx].to(device),
                                      batch.response_ids[idx].to(device),
                                      mask.to(device)).cpu()
            vl = objectives.value_loss(values, old_values[idx], returns[idx], mask,
                                       clip=value_clip,
                                       aggregation=cfg.algorithm.loss_aggregation,
                                       max_tokens=cfg.max_response_tokens)
            if not torch.isfinite(vl.loss):
                raise NonFiniteUpdate(f"value loss is {vl.loss.item()}; the step was not "
                                      "applied")
            critic.optimizer.zero_grad(set_to_none=True)
            vl.loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            if not torch.isfinite(grad_norm):
                critic.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteUpdate(f"critic gradient norm is {grad_norm.item()}; the step "
                                      "was not applied")
            critic.optimizer.step()
            steps += 1
            totals["loss/value"] += float(vl.loss.detach())
            totals["value/clip_fraction"] += float(objectives.aggregate(vl.clipped, mask,
                                                                        "token_mean", 1))
            totals["value/grad_norm"] += float(grad_norm)
    metrics = {k: v / max(steps, 1) for k, v in totals.items()}
    metrics["value/lr"] = float(critic.scheduler.get_last_lr()[0])
    critic.scheduler.step()
    return metrics


def learn_ppo(model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, critic: Critic,
              batch: RolloutBatch, ref_logp: Tensor | None, token_penalty: Tensor | None,
              cfg: LearnerConfig, generator: torch.Generator, *,
              update_policy: bool) -> dict[str, float]:
    """One PPO update: GAE targets from the rollout-time values, the critic's update, then
    (after critic.warmup_updates) the policy's clipped-surrogate update on token advantages.
    During warmup the policy, its optimizer and its LR schedule are left untouched."""
    gae = cfg.algorithm.gae
    assert gae is not None and batch.values is not None
    advantages, returns = gae_targets(batch, cfg.algorithm, token_penalty)
    batch.returns = returns
    check_returns(batch)
    metrics = update_critic(critic, batch, returns, cfg, generator,
                            value_clip=gae.critic.value_clip)
    sampled = batch.response_mask.bool()
    metrics.update({"value/mean": float(batch.values[sampled].mean()),
                    "returns/mean": float(returns[sampled].mean()),
                    "policy/updated": float(update_policy)})
    if update_policy:
        metrics.update(update(model, optimizer, scheduler, batch, advantages, ref_logp, cfg,
                              generator))
    return metrics
