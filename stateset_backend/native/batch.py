"""A rollout batch and the integrity check every batch passes before the learner sees it.

A learner that trains on a misaligned mask, an out-of-vocabulary id or a log-prob that was
quietly recomputed produces a run that looks fine and means nothing; such a batch is refused
and the run fails with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


class BatchIntegrityError(ValueError):
    """The batch is not safe to learn from."""


@dataclass
class RolloutBatch:
    prompt_ids: Tensor  # [B, P] long, left-padded
    prompt_mask: Tensor  # [B, P] float 0/1
    response_ids: Tensor  # [B, T] long, right-padded
    response_mask: Tensor  # [B, T] float 0/1
    sample_logprobs: Tensor  # [B, T] float, log-prob at sampling time; NaN where missing
    group_ids: Tensor  # [B] long, 0..G-1
    prompt_index: Tensor  # [B] long, data-set row of each sample's prompt
    rewards: Tensor  # [B] float
    policy_version: int
    # PPO: the critic's V(s_t) per response token, recorded at rollout; NaN where not sampled
    values: Tensor | None = None
    # PPO: GAE's value targets (advantages + values), set by the learner, checked before use
    returns: Tensor | None = None
    # the responses as text, as the reward read them (decoded once, written with trajectories)
    texts: list[str] | None = None

    @property
    def size(self) -> int:
        return int(self.response_ids.shape[0])

    def select(self, keep: Tensor) -> RolloutBatch:
        """The samples where ``keep`` is True, with group ids renumbered densely."""
        idx = keep.nonzero().squeeze(-1)
        _, dense = torch.unique(self.group_ids[idx], return_inverse=True)
        return RolloutBatch(self.prompt_ids[idx], self.prompt_mask[idx],
                            self.response_ids[idx], self.response_mask[idx],
                            self.sample_logprobs[idx], dense, self.prompt_index[idx],
                            self.rewards[idx], self.policy_version,
                            None if self.values is None else self.values[idx],
                            None if self.returns is None else self.returns[idx],
                            None if self.texts is None else [self.texts[i] for i in
                                                             idx.tolist()])

    @staticmethod
    def concat(parts: list[RolloutBatch]) -> RolloutBatch:
        """Join batches (e.g. dynamic-sampling rounds), padding to the widest and keeping
        groups distinct."""
        width_p = max(p.prompt_ids.shape[1] for p in parts)
        width_r = max(p.response_ids.shape[1] for p in parts)

        def pad(t: Tensor, width: int, left: bool, value: float) -> Tensor:
            extra = width - t.shape[1]
            if extra == 0:
                return t
            filler = torch.full((t.shape[0], extra), value, dtype=t.dtype)
            return torch.cat([filler, t] if left else [t, filler], dim=1)

        offset, group_ids = 0, []
        for p in parts:
            group_ids.append(p.group_ids + offset)
            offset += int(p.group_ids.max().item()) + 1 if p.size else 0
        recorded = [p.values for p in parts if p.values is not None]
        if recorded and len(recorded) != len(parts):
            raise BatchIntegrityError("some rollout rounds carry critic values and some do not")
        values = torch.cat([pad(v, width_r, False, float("nan")) for v in recorded]) \
            if recorded else None
        return RolloutBatch(
            torch.cat([pad(p.prompt_ids, width_p, True, 0) for p in parts]),
            torch.cat([pad(p.prompt_mask, width_p, True, 0.0) for p in parts]),
            torch.cat([pad(p.response_ids, width_r, False, 0) for p in parts]),
            torch.cat([pad(p.response_mask, width_r, False, 0.0) for p in parts]),
            torch.cat([pad(p.sample_logprobs, width_r, False, float("nan")) for p in parts]),
            torch.cat(group_ids), torch.cat([p.prompt_index for p in parts]),
            torch.cat([p.rewards for p in parts]), parts[0].policy_version, values,
            texts=None if any(p.texts is None for p in parts) else
            [t for p in parts for t in p.texts or []])


def _binary(t: Tensor) -> bool:
    return bool(((t == 0) | (t == 1)).all())


def check_batch(batch: RolloutBatch, *, vocab_size: int, group_size: int,
                critic: bool = False) -> None:
    """Raise BatchIntegrityError naming the first problem found. With ``critic`` the batch
    must carry the critic's rollout-time values (check_values)."""
    b = batch.size
    if b == 0:
        raise BatchIntegrityError("empty batch")
    shapes = {
        "prompt_mask": (batch.prompt_mask.shape, batch.prompt_ids.shape),
        "response_mask": (batch.response_mask.shape, batch.response_ids.shape),
        "sample_logprobs": (batch.sample_logprobs.shape, batch.response_ids.shape),
    }
    for name, (got, want) in shapes.items():
        if got != want:
            raise BatchIntegrityError(f"{name} has shape {tuple(got)}, expected {tuple(want)}")
    for name, t in (("prompt_ids", batch.prompt_ids), ("group_ids", batch.group_ids),
                    ("prompt_index", batch.prompt_index), ("rewards", batch.rewards)):
        if t.shape[0] != b:
            raise BatchIntegrityError(f"{name} has {t.shape[0]} rows, expected {b}")
    for name, ids in (("prompt_ids", batch.prompt_ids), ("response_ids", batch.response_ids)):
        if bool(((ids < 0) | (ids >= vocab_size)).any()):
            raise BatchIntegrityError(f"{name} holds token ids outside the vocabulary "
                                      f"[0, {vocab_size})")
    for name, mask in (("prompt_mask", batch.prompt_mask),
                       ("response_mask", batch.response_mask)):
        if not _binary(mask):
            raise BatchIntegrityError(f"{name} is not binary")
    # aligned: prompts are left-padded (0s then 1s), responses right-padded (1s then 0s)
    if bool((batch.prompt_mask[:, 1:] < batch.prompt_mask[:, :-1]).any()):
        raise BatchIntegrityError("prompt_mask is not left-aligned")
    if bool((batch.response_mask[:, 1:] > batch.response_mask[:, :-1]).any()):
        raise BatchIntegrityError("response_mask has a gap: tokens after the end of a sample")
    if bool((batch.response_mask.sum(-1) == 0).any()):
        raise BatchIntegrityError("a sample has no response token")
    if not bool(torch.isfinite(batch.rewards).all()):
        raise BatchIntegrityError("a reward is not finite")
    sampled = batch.response_mask.bool()
    lp = batch.sample_logprobs[sampled]
    if bool(torch.isnan(lp).any()):
        raise BatchIntegrityError(f"{int(torch.isnan(lp).sum())} sampled token(s) have no "
                                  "sampling-time log-prob (never recomputed or invented)")
    if not bool(torch.isfinite(lp).all()) or bool((lp > 0).any()):
        raise BatchIntegrityError("a sampling-time log-prob is not a finite value <= 0")
    counts = torch.bincount(batch.group_ids)
    if bool((counts != group_size).any()):
        bad = int((counts != group_size).nonzero()[0].item())
        raise BatchIntegrityError(f"group {bad} has {int(counts[bad])} samples, expected "
                                  f"exactly {group_size}")
    expected = torch.arange(counts.numel()).repeat_interleave(group_size)
    if not torch.equal(batch.group_ids, expected):
        raise BatchIntegrityError("groups are not contiguous: each group's samples must be "
                                  "adjacent (the learner shares their prompt prefill)")
    # contiguous groups of group_size: each group's rows against its first row, all at once
    groups = counts.numel()
    index = batch.prompt_index.view(groups, group_size)
    ids = batch.prompt_ids.view(groups, group_size, -1)
    mixed = (index != index[:, :1]).any(-1) | (ids != ids[:, :1]).flatten(1).any(-1)
    if bool(mixed.any()):
        g = int(mixed.nonzero()[0].item())
        raise BatchIntegrityError(f"group {g} mixes samples of different prompts")
    if critic or batch.values is not None:
        check_values(batch)


def _token_field(batch: RolloutBatch, name: str, t: Tensor | None) -> Tensor:
    if t is None:
        raise BatchIntegrityError(f"the batch has no {name}: PPO learns from the critic's "
                                  "values recorded at rollout, never from values made up later")
    if t.shape != batch.response_ids.shape:
        raise BatchIntegrityError(f"{name} has shape {tuple(t.shape)}, expected "
                                  f"{tuple(batch.response_ids.shape)}")
    sampled = batch.response_mask.bool()
    if not bool(torch.isfinite(t[sampled]).all()):
        raise BatchIntegrityError(f"{name} of a sampled token is not finite")
    return t


def check_values(batch: RolloutBatch) -> None:
    """The critic's values cover exactly the sampled tokens: finite on each, NaN elsewhere (a
    value on a token nobody sampled was invented)."""
    values = _token_field(batch, "values", batch.values)
    if bool((~torch.isnan(values[~batch.response_mask.bool()])).any()):
        raise BatchIntegrityError("values has a number on a token that was not sampled")


def check_returns(batch: RolloutBatch) -> None:
    """GAE's value targets, before the critic regresses on them: the values they were built
    from are intact, and every sampled token has a finite return."""
    check_values(batch)
    _token_field(batch, "returns", batch.returns)


# -- conversations -------------------------------------------------------------------------
ROLE_PAD, ROLE_ENVIRONMENT, ROLE_ASSISTANT = 0, 1, 2  # conversation.py records these


@dataclass
class ConversationBatch:
    """Whole conversations, one row each: opening, assistant turns and observations in one
    token sequence. ``roles`` and ``sample_logprobs`` are recorded by the rollout as tokens
    are appended; ``loss_mask`` is what the learner trains on, and the integrity check proves
    it covers assistant-sampled tokens only."""

    ids: Tensor  # [B, L] long
    attention: Tensor  # [B, L] float, 1 = a real token (assistant or environment)
    roles: Tensor  # [B, L] long: 0 pad, 1 environment/context, 2 assistant-sampled
    loss_mask: Tensor  # [B, L] float: tokens that carry loss
    sample_logprobs: Tensor  # [B, L] float, NaN where nothing was sampled
    turn_ids: Tensor  # [B, L] long, assistant turn of each sampled token, -1 elsewhere
    turn_rewards: Tensor  # [B, K] float, the environment's reward per turn, NaN past the end
    group_ids: Tensor  # [B] long, 0..G-1, contiguous
    prompt_index: Tensor  # [B] long, data-set row of each conversation's task
    conversation_index: Tensor  # [B] long, the conversation's number in its update
    rewards: Tensor  # [B] float, the conversation's return (see objectives.conversation_return)
    policy_version: int

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])

    @property
    def response_mask(self) -> Tensor:
        return self.loss_mask

    def select(self, keep: Tensor) -> ConversationBatch:
        idx = keep.nonzero().squeeze(-1)
        _, dense = torch.unique(self.group_ids[idx], return_inverse=True)
        return ConversationBatch(
            self.ids[idx], self.attention[idx], self.roles[idx], self.loss_mask[idx],
            self.sample_logprobs[idx], self.turn_ids[idx], self.turn_rewards[idx], dense,
            self.prompt_index[idx], self.conversation_index[idx], self.rewards[idx],
            self.policy_version)


def check_conversation_batch(batch: ConversationBatch, *, vocab_size: int,
                             group_size: int) -> None:
    """Raise BatchIntegrityError naming the first problem; above all, a token that carries
    loss but was not sampled by the policy (an environment, tool or padding token)."""
    b = batch.size
    if b == 0:
        raise BatchIntegrityError("empty batch")
    for name in ("attention", "roles", "loss_mask", "sample_logprobs", "turn_ids"):
        if getattr(batch, name).shape != batch.ids.shape:
            raise BatchIntegrityError(f"{name} has shape {tuple(getattr(batch, name).shape)}, "
                                      f"expected {tuple(batch.ids.shape)}")
    for name in ("turn_rewards", "group_ids", "prompt_index", "conversation_index", "rewards"):
        if getattr(batch, name).shape[0] != b:
            raise BatchIntegrityError(f"{name} has {getattr(batch, name).shape[0]} rows, "
                                      f"expected {b}")
    if bool(((batch.ids < 0) | (batch.ids >= vocab_size)).any()):
        raise BatchIntegrityError(f"ids hold token ids outside the vocabulary [0, {vocab_size})")
    for name in ("attention", "loss_mask"):
        if not _binary(getattr(batch, name)):
            raise BatchIntegrityError(f"{name} is not binary")
    real = batch.attention.bool()
    assistant = batch.roles == ROLE_ASSISTANT
    if bool((real != (batch.roles != ROLE_PAD)).any()):
        raise BatchIntegrityError("roles and attention disagree about which tokens are real")
    carries = batch.loss_mask.bool()
    leaked = carries & ~assistant
    if bool(leaked.any()):
        raise BatchIntegrityError(f"{int(leaked.sum())} environment, tool or padding token(s) "
                                  "carry loss: only the assistant's own sampled tokens may")
    if bool((assistant & ~carries).any()):
        raise BatchIntegrityError("an assistant-sampled token of a conversation in the batch "
                                  "carries no loss")
    lp = batch.sample_logprobs
    if bool(torch.isnan(lp[assistant]).any()):
        raise BatchIntegrityError("a sampled token has no sampling-time log-prob (never "
                                  "recomputed or invented)")
    if bool((~torch.isnan(lp[~assistant])).any()):
        raise BatchIntegrityError("a token the policy did not sample has a sampling-time "
                                  "log-prob: environment tokens are never sampled")
    if not bool(torch.isfinite(lp[assistant]).all()) or bool((lp[assistant] > 0).any()):
        raise BatchIntegrityError("a sampling-time log-prob is not a finite value <= 0")
    if bool(((batch.turn_ids >= 0) != assistant).any()):
        raise BatchIntegrityError("turn ids do not mark exactly the sampled tokens")
    if bool((carries.sum(-1) == 0).any()):
        raise BatchIntegrityError("a conversation has no assistant token")
    if not bool(torch.isfinite(batch.rewards).all()):
        raise BatchIntegrityError("a conversation's return is not finite")
    turns = batch.turn_ids.max(-1).values + 1
    have = (~torch.isnan(batch.turn_rewards)).sum(-1)
    if bool((have != turns).any()):
        raise BatchIntegrityError("a conversation's turn rewards do not match its turns: every "
                                  "assistant turn has exactly one reward from the environment")
    counts = torch.bincount(batch.group_ids)
    if bool((counts < min(2, group_size)).any()) or bool((counts > group_size).any()):
        raise BatchIntegrityError(f"a group has {int(counts.min())}..{int(counts.max())} "
                                  f"conversations, expected 2..{group_size}")
    if bool((batch.group_ids[1:] < batch.group_ids[:-1]).any()):
        raise BatchIntegrityError("groups are not contiguous")
    for g in range(counts.numel()):
        rows = (batch.group_ids == g).nonzero().squeeze(-1)
        if bool((batch.prompt_index[rows] != batch.prompt_index[rows[0]]).any()):
            raise BatchIntegrityError(f"group {g} mixes conversations of different tasks")
