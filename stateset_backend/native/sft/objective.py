"""Supervised fine-tuning on prompt/answer rows: layout, integrity check and one update.

The loss is the negative log-likelihood of the answer tokens only; prompt tokens are context.
Rows are laid out as the spec says: ``padded`` (one row per sequence, right-padded) or
``packed`` (rows concatenated into sequences of at most ``capacity`` tokens, each attending
only to itself, with its own positions). Either way every answer token's loss is gathered
back into one ``[rows, answer tokens]`` grid and aggregated by the same registry the RL losses
use, so the two layouts give the same loss on the same rows.

Like a rollout batch, an SFT batch is checked before the learner sees it: a mask that let one
prompt token into the loss would quietly train the model to write prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stateset_backend.native import objectives
from stateset_backend.native.batch import BatchIntegrityError
from stateset_backend.native.learner import LearnerConfig, NonFiniteUpdate


@dataclass(frozen=True)
class SFTExample:
    """One data row, tokenized: the prompt as the model sees it, the answer it should write."""

    index: int  # the data-set row
    prompt_ids: list[int]
    answer_ids: list[int]


@dataclass
class SFTBatch:
    """One update's rows laid out for a forward pass; position ``t`` predicts token ``t+1``."""

    input_ids: Tensor  # [R, L] long
    attention_mask: Tensor  # [R, L] padded; [R, 1, L, L] bool block-causal when packed
    position_ids: Tensor  # [R, L] long, restarting at 0 for every example
    segment_ids: Tensor  # [R, L] long: which example each token belongs to, -1 = padding
    is_answer: Tensor  # [R, L] bool: the token is one the loss learns
    answer_at: Tensor  # [N, A] long: flat index into the [R, L] grid of each answer token
    answer_mask: Tensor  # [N, A] float 0/1: real answer tokens of each example
    example_index: Tensor  # [N] long: the data-set row of each example
    prompt_lengths: Tensor  # [N] long
    answer_lengths: Tensor  # [N] long
    layout: str

    @property
    def response_mask(self) -> Tensor:
        """The tokens learned from (what the trainer counts as trained tokens)."""
        return self.answer_mask

    @property
    def size(self) -> int:
        return int(self.example_index.shape[0])


def _rows(examples: list[SFTExample], layout: str, capacity: int) -> list[list[int]]:
    """Which examples share a sequence: one each when padded; greedily in order when packed."""
    if layout == "padded":
        return [[n] for n in range(len(examples))]
    rows: list[list[int]] = []
    used = capacity
    for n, ex in enumerate(examples):
        length = len(ex.prompt_ids) + len(ex.answer_ids)
        if used + length > capacity:
            rows.append([])
            used = 0
        rows[-1].append(n)
        used += length
    return rows


def lay_out(examples: list[SFTExample], layout: str, *, pad_id: int,
            capacity: int) -> SFTBatch:
    """The batch of ``examples`` in the spec's layout; ``capacity`` bounds a packed sequence."""
    rows = _rows(examples, layout, capacity)
    width = max(sum(len(examples[n].prompt_ids) + len(examples[n].answer_ids) for n in row)
                for row in rows)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    segment_ids = torch.full(shape, -1, dtype=torch.long)
    is_answer = torch.zeros(shape, dtype=torch.bool)
    longest = max(len(ex.answer_ids) for ex in examples)
    answer_at = torch.zeros((len(examples), longest), dtype=torch.long)
    answer_mask = torch.zeros((len(examples), longest))
    for r, row in enumerate(rows):
        start = 0
        for n in row:
            ex = examples[n]
            ids = ex.prompt_ids + ex.answer_ids
            end = start + len(ids)
            input_ids[r, start:end] = torch.tensor(ids)
            position_ids[r, start:end] = torch.arange(len(ids))
            segment_ids[r, start:end] = n
            first = start + len(ex.prompt_ids)
            is_answer[r, first:end] = True
            answer_at[n, :len(ex.answer_ids)] = r * width + torch.arange(first, end)
            answer_mask[n, :len(ex.answer_ids)] = 1.0
            start = end
    real = segment_ids >= 0
    if layout == "packed":
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        attention: Tensor = (causal & same & real[:, :, None])[:, None]
    else:
        attention = real.long()
    return SFTBatch(input_ids, attention, position_ids, segment_ids, is_answer, answer_at,
                    answer_mask, torch.tensor([ex.index for ex in examples]),
                    torch.tensor([len(ex.prompt_ids) for ex in examples]),
                    torch.tensor([len(ex.answer_ids) for ex in examples]), layout)


def check_sft_batch(batch: SFTBatch, *, vocab_size: int) -> None:
    """Refuse a batch whose loss would reach a prompt or padding token, skip an answer token,
    or read an id outside the vocabulary."""
    ids, segments, answer = batch.input_ids, batch.segment_ids, batch.is_answer
    if bool(((ids < 0) | (ids >= vocab_size)).any()):
        raise BatchIntegrityError("an SFT batch holds a token id outside the vocabulary")
    if bool((answer & (segments < 0)).any()):
        raise BatchIntegrityError("the SFT loss mask reaches a padding token")
    flat_answer = answer.flatten()
    gathered = flat_answer[batch.answer_at]
    if not bool(gathered[batch.answer_mask.bool()].all()):
        raise BatchIntegrityError("an answer token the loss reads is not marked as an answer")
    if int(batch.answer_mask.sum()) != int(answer.sum()):
        raise BatchIntegrityError("the SFT loss mask and the answer tokens it gathers differ")
    for n in range(batch.size):
        mine = segments == n
        if int(mine.sum()) != int(batch.prompt_lengths[n] + batch.answer_lengths[n]):
            raise BatchIntegrityError(f"example {n} of the SFT batch has the wrong length")
        learned = answer & mine
        if int(learned.sum()) != int(batch.answer_lengths[n]):
            raise BatchIntegrityError(f"example {n}: the loss reads {int(learned.sum())} "
                                      f"tokens, its answer has {int(batch.answer_lengths[n])}")
        positions = batch.position_ids[mine]
        if int(positions[0]) != 0 or bool((positions[1:] - positions[:-1] != 1).any()):
            raise BatchIntegrityError(f"example {n}: positions do not count up from 0")
        if batch.prompt_lengths[n] < 1 or bool(positions[learned[mine]].min() <
                                              batch.prompt_lengths[n]):
            raise BatchIntegrityError(f"example {n}: the loss reaches a prompt token")


def answer_token_losses(model: Any, batch: SFTBatch) -> tuple[Tensor, Tensor]:
    """Per answer token ``[N, A]``: the negative log-likelihood and whether the greedy
    prediction was right. Each answer token is predicted from the position before it."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids).logits.float()
    width = batch.input_ids.shape[1]
    logp = torch.log_softmax(logits[:, :-1], dim=-1)  # position t predicts token t + 1
    targets = batch.input_ids[:, 1:]
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    right = (logp.argmax(-1) == targets).float()
    # answer token at grid position p is predicted at p - 1 (never at a row's first column:
    # every example starts with at least one prompt token, which the check proves)
    at = batch.answer_at - 1 - batch.answer_at // width
    keep = batch.answer_mask
    return nll.flatten()[at] * keep, right.flatten()[at] * keep


def sft_loss(model: Any, batch: SFTBatch, aggregation: str,
             max_tokens: int) -> tuple[Tensor, Tensor]:
    """(loss, token accuracy) of one batch, aggregated like the RL losses."""
    nll, right = answer_token_losses(model, batch)
    loss = objectives.aggregate(nll, batch.answer_mask, aggregation, max_tokens)
    return loss, objectives.aggregate(right, batch.answer_mask, "token_mean", 1)


def sft_update(model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, batch: SFTBatch,
               cfg: LearnerConfig) -> dict[str, float]:
    """One optimizer step on a checked batch; returns canonical metrics."""
    model.train()
    with cfg.compute():
        loss, accuracy = sft_loss(model, batch, cfg.algorithm.loss_aggregation,
                                  cfg.max_response_tokens)
    if not torch.isfinite(loss):
        raise NonFiniteUpdate(f"loss is {loss.item()}; the step was not applied")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteUpdate(f"gradient norm is {grad_norm.item()}; the step was not applied")
    optimizer.step()
    metrics = {"loss/sft": float(loss.detach()), "token_accuracy": float(accuracy),
               "grad_norm": float(grad_norm), "lr": float(scheduler.get_last_lr()[0])}
    scheduler.step()
    assert all(math.isfinite(v) for v in metrics.values())
    return metrics


@torch.no_grad()
def sft_evaluate(model: Any, batches: list[SFTBatch], compute: Any) -> dict[str, float]:
    """Validation loss and token accuracy, teacher-forced, per answer token (whatever the
    training aggregation, so runs with different aggregations compare)."""
    model.eval()
    loss_sum = right_sum = tokens = 0.0
    for batch in batches:
        with compute():
            nll, right = answer_token_losses(model, batch)
        loss_sum += float(nll.sum())
        right_sum += float(right.sum())
        tokens += float(batch.answer_mask.sum())
    return {"val/loss": loss_sum / tokens, "val/token_accuracy": right_sum / tokens}
