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
                            self.rewards[idx], self.policy_version)

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
        return RolloutBatch(
            torch.cat([pad(p.prompt_ids, width_p, True, 0) for p in parts]),
            torch.cat([pad(p.prompt_mask, width_p, True, 0.0) for p in parts]),
            torch.cat([pad(p.response_ids, width_r, False, 0) for p in parts]),
            torch.cat([pad(p.response_mask, width_r, False, 0.0) for p in parts]),
            torch.cat([pad(p.sample_logprobs, width_r, False, float("nan")) for p in parts]),
            torch.cat(group_ids), torch.cat([p.prompt_index for p in parts]),
            torch.cat([p.rewards for p in parts]), parts[0].policy_version)


def _binary(t: Tensor) -> bool:
    return bool(((t == 0) | (t == 1)).all())


def check_batch(batch: RolloutBatch, *, vocab_size: int, group_size: int) -> None:
    """Raise BatchIntegrityError naming the first problem found."""
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
    for g in range(counts.numel()):
        rows = (batch.group_ids == g).nonzero().squeeze(-1)
        if bool((batch.prompt_index[rows] != batch.prompt_index[rows[0]]).any()) or \
                bool((batch.prompt_ids[rows] != batch.prompt_ids[rows[0]]).any()):
            raise BatchIntegrityError(f"group {g} mixes samples of different prompts")
