"""Sampling with a KV cache, recording each token's log-prob at the moment it is sampled.

The learner's importance ratios are taken against exactly these log-probs; they are never
recomputed afterwards, so a mismatch between the sampler and the learner shows up as a ratio
away from 1 instead of being hidden.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def positions_from_mask(mask: Tensor) -> Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _cache_name(model: Any) -> str:
    """transformers renamed ``past_key_values`` to ``cache``; speak whichever is installed."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _cache_name_of(type(base).forward)


@functools.cache
def _cache_name_of(forward: Any) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def group_generators(seed: int, update: int, groups: range) -> list[torch.Generator]:
    """One generator per group, seeded from (seed, update, the group's place in the update).

    What a group samples then depends on nothing else in the batch: a rank that samples only
    its own groups draws exactly what one process draws for them, and a resumed run draws what
    the uninterrupted one did without restoring any sampling state.
    """
    def seeded(group: int) -> torch.Generator:
        digest = hashlib.sha256(f"rollout:{seed}:{update}:{group}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)

    return [seeded(g) for g in groups]


def _draw(probs: Tensor, generator: torch.Generator | Sequence[torch.Generator] | None,
          group_size: int) -> Tensor:
    """One token per row: from one generator for the batch, or each group from its own."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1)
    rows = probs.cpu().split(group_size)
    if len(rows) != len(generator):
        raise ValueError(f"{len(rows)} groups but {len(generator)} generators")
    return torch.cat([torch.multinomial(r, 1, generator=g) for r, g in
                      zip(rows, generator, strict=True)]).squeeze(-1)


def _top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    drop = sorted_probs.cumsum(-1) - sorted_probs > top_p
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum(-1, keepdim=True)


def _top_k_filter(probs: Tensor, top_k: int | None) -> Tensor:
    if top_k is None or top_k >= probs.shape[-1]:
        return probs
    kth = probs.topk(top_k, dim=-1).values[..., -1:]
    filtered = probs.masked_fill(probs < kth, 0.0)
    return filtered / filtered.sum(-1, keepdim=True)


def _prefill(model: Any, prompt_ids: Tensor, prompt_mask: Tensor,
             group_size: int) -> tuple[Tensor, Any, Tensor]:
    """Run each distinct prompt once and share its KV cache across its group.

    Rows come in contiguous groups of ``group_size`` samples of one prompt, so the prompt's
    keys and values are computed once per group instead of once per sample: with 16 samples
    per prompt that removes ~15/16 of the prompt compute, in sampling and in the learner.
    Returns (last-position logits per row, the expanded cache, positions of the next token).
    """
    from transformers import DynamicCache

    cache_arg = _cache_name(model)
    unique_ids, unique_mask = prompt_ids[::group_size], prompt_mask[::group_size].long()
    out = model(input_ids=unique_ids, attention_mask=unique_mask,
                position_ids=positions_from_mask(unique_mask), use_cache=True,
                **{cache_arg: DynamicCache()})
    cache = out[cache_arg]
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
    last_logits = out.logits[:, -1, :].repeat_interleave(group_size, dim=0)
    return last_logits, cache, prompt_mask.long().sum(-1)


@torch.no_grad()
def sample(model: Any, prompt_ids: Tensor, prompt_mask: Tensor, *, max_new_tokens: int,
           temperature: float, top_p: float, eos_id: int, pad_id: int,
           generator: torch.Generator | Sequence[torch.Generator] | None,
           greedy: bool = False,
           group_size: int = 1, top_k: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(response_ids, response_mask, sample_logprobs), each [N, T]; NaN log-prob after EOS.

    Top-k, then top-p, filter the temperature-scaled distribution (vLLM's order); the recorded
    log-prob is the token's under the unfiltered distribution. ``greedy`` takes the argmax.
    ``generator`` is one generator for the whole batch, or one per group (group_generators).
    """
    was_training = model.training
    model.eval()
    device = prompt_ids.device
    n = prompt_ids.shape[0]
    cache_arg = _cache_name(model)
    logits, cache, next_pos = _prefill(model, prompt_ids, prompt_mask, group_size)
    attn = prompt_mask.long()
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    ids, masks, logps = [], [], []
    for step in range(max_new_tokens):
        log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
        if greedy:
            token = log_probs.argmax(-1)
        else:
            probs = _top_p_filter(_top_k_filter(log_probs.exp(), top_k), top_p)
            token = _draw(probs, generator, group_size).to(device)
        lp = log_probs.gather(-1, token[:, None]).squeeze(-1)
        live = ~finished
        ids.append(torch.where(live, token, torch.full_like(token, pad_id)))
        masks.append(live.float())
        logps.append(torch.where(live, lp, torch.full_like(lp, float("nan"))))
        finished = finished | (token == eos_id)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
        out = model(input_ids=ids[-1][:, None], attention_mask=attn,
                    position_ids=next_pos[:, None], use_cache=True, **{cache_arg: cache})
        cache = out[cache_arg]
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    if was_training:
        model.train()
    return torch.stack(ids, 1), torch.stack(masks, 1), torch.stack(logps, 1)


def response_logprobs(model: Any, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                      response_mask: Tensor, temperature: float,
                      group_size: int = 1) -> tuple[Tensor, Tensor]:
    """Learner-side (log-prob, entropy) of each response token, with gradients.

    Uses the same shared-prompt prefill as sampling; gradients flow through the shared
    prompt keys and values into every sample of the group.
    """
    first_logits, cache, prompt_len = _prefill(model, prompt_ids, prompt_mask, group_size)
    logits = first_logits[:, None, :]
    t = response_ids.shape[1]
    if t > 1:
        attn = torch.cat([prompt_mask, response_mask[:, :-1]], dim=1).long()
        positions = prompt_len[:, None] + torch.arange(t - 1, device=prompt_ids.device)
        out = model(input_ids=response_ids[:, :-1], attention_mask=attn,
                    position_ids=positions, use_cache=True, **{_cache_name(model): cache})
        logits = torch.cat([logits, out.logits], dim=1)
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    token_logp = log_probs.gather(-1, response_ids[..., None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return token_logp, entropy
