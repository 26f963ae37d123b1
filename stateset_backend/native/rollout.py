"""Sampling with a KV cache, recording each token's log-prob at the moment it is sampled.

The learner's importance ratios are taken against exactly these log-probs; they are never
recomputed afterwards, so a mismatch between the sampler and the learner shows up as a ratio
away from 1 instead of being hidden. Only algorithm.rollout_correction takes the learner's own
log-probs as the ratios' denominator, and then the mismatch is its explicit weight instead.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from stateset_backend.native import fast_decode, grouped_llama
from stateset_backend.native.options import KERNELS


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


def uniforms(generator: torch.Generator | Sequence[torch.Generator] | None, rows: int,
             steps: int, group_size: int) -> Tensor:
    """[rows, steps] uniform draws in [0, 1): from one generator for the batch, or each group's
    rows from its own. Drawn once per rollout, not once per token: a per-group draw at every
    step cost more than the model's forward (3.5 ms a step for 16 groups)."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand((rows, steps), generator=generator, dtype=torch.float64)
    if rows != group_size * len(generator):
        raise ValueError(f"{rows // max(group_size, 1)} groups but {len(generator)} generators")
    return torch.cat([torch.rand((group_size, steps), generator=g, dtype=torch.float64)
                      for g in generator])


def draw(probs: Tensor, u: Tensor) -> Tensor:
    """One token per row by inverse transform: the first token whose cumulative probability
    exceeds ``u`` times the row's total. A token of probability zero (filtered by top-k or
    top-p) has no interval of its own and is never drawn; float64 keeps a large vocabulary's
    cumulative sum exact enough that no token's interval is lost."""
    cdf = probs.double().cumsum(-1)
    u = u if u.device == cdf.device else u.to(cdf.device)
    token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
    token = token.squeeze(-1).clamp(max=probs.shape[-1] - 1)
    # u * total rounding up to the total lands past the last token of nonzero probability
    drawn_zero = probs.gather(-1, token[:, None]).squeeze(-1) <= 0
    if bool(drawn_zero.any()):
        last = (torch.arange(probs.shape[-1], device=probs.device) * (probs > 0)).argmax(-1)
        token = torch.where(drawn_zero, last, token)
    return token


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


def _decoder(model: Any, prompt_ids: Tensor, prompt_mask: Tensor, group_size: int,
             steps: int,
             kernels: str = "exact") -> tuple[Tensor, Callable[[Tensor, Tensor], Tensor]]:
    """(the first token's logits, a step function: (last sampled tokens, the rows still
    generating) -> next logits, of no meaning for finished rows), for at most ``steps``
    tokens. ``kernels="fast"`` decodes through fast_decode where the grouped forward runs
    (elsewhere the model's own forward is the only one)."""
    n = prompt_ids.shape[0]
    if kernels == "fast" and not grouped_llama.supports(model):  # the trainer refuses it first
        raise ValueError("sampling kernels 'fast' decode through the Llama-family forward, "
                         "which this model does not run")
    if grouped_llama.supports(model):
        lean = grouped_llama.GroupedLlama.of(model)
        joined = lean.joined()
        prompt = _encode_prompts(lean, prompt_ids, prompt_mask, group_size, joined)
        if kernels == "fast":
            fast = fast_decode.FastDecoder(lean, prompt, prompt_mask, group_size, steps,
                                           joined)
            return fast.first, fast.step
        positions = prompt_mask.long().sum(-1)[:, None] + \
            torch.arange(max(steps - 1, 1), device=prompt_ids.device)
        buffers = lean.new_cache(n, max(steps - 1, 1), prompt.last_hidden)
        cos, sin = lean.rope_table(positions, prompt.last_hidden.dtype)
        done = 0
        live: Tensor | None = None  # the rows the cache holds, where not all of them

        def grouped_step(tokens: Tensor, alive: Tensor | None = None) -> Tensor:
            nonlocal done, buffers, live
            if alive is not None:
                buffers, live = _drop_finished(buffers, live, alive, done)
            at = slice(done, done + 1)
            hidden = lean.extend(prompt, group_size, tokens[:, None], positions[:, at],
                                 buffers, done, rope=(cos[:, :, at], sin[:, :, at]),
                                 joined=joined, live=live)
            done += 1
            return lean.logits(hidden[:, -1])

        return lean.first_logits(prompt, group_size), grouped_step

    cache_arg = _cache_name(model)
    logits, cache, next_pos = _prefill(model, prompt_ids, prompt_mask, group_size)
    attn = prompt_mask.long()

    def step(tokens: Tensor, alive: Tensor | None = None) -> Tensor:
        nonlocal cache, next_pos, attn
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=attn.device)],
                         dim=1)
        out = model(input_ids=tokens[:, None], attention_mask=attn,
                    position_ids=next_pos[:, None], use_cache=True, **{cache_arg: cache})
        cache, next_pos = out[cache_arg], next_pos + 1
        return out.logits[:, -1, :]

    return logits, step


# the finished rows are dropped from the KV cache once they are this share of the rows it holds
DROP_SHARE = 0.125


def _drop_finished(buffers: list[tuple[Tensor, Tensor]], live: Tensor | None, alive: Tensor,
                   done: int) -> tuple[list[tuple[Tensor, Tensor]], Tensor | None]:
    """The cache without the rows that have finished, once they are ``DROP_SHARE`` of it.

    A finished row samples padding to the end, yet its attention read its whole own cache at
    every step: with 512-token completions most rows finish within the first 200 tokens, and
    reading their keys and values was most of a token step. Its rows are copied out once per
    drop (the tokens so far), and each later step reads only the live ones."""
    held = live if live is not None else torch.arange(alive.shape[0], device=alive.device)
    keep = alive.index_select(0, held)
    kept = int(keep.sum())
    if kept > (1 - DROP_SHARE) * held.shape[0] or kept == 0:
        return buffers, live
    rows = keep.nonzero().squeeze(-1)
    dropped = []
    for keys, values in buffers:
        smaller = [x.new_empty((kept, *x.shape[1:])) for x in (keys, values)]
        for new, old in zip(smaller, (keys, values), strict=True):
            new[:, :, :done] = old[:, :, :done].index_select(0, rows)
        dropped.append((smaller[0], smaller[1]))
    return dropped, held.index_select(0, rows)


@torch.no_grad()
def sample(model: Any, prompt_ids: Tensor, prompt_mask: Tensor, *, max_new_tokens: int,
           temperature: float, top_p: float, eos_id: int, pad_id: int,
           generator: torch.Generator | Sequence[torch.Generator] | None,
           greedy: bool = False, group_size: int = 1, top_k: int | None = None,
           max_total_tokens: int | None = None,
           kernels: str = "exact") -> tuple[Tensor, Tensor, Tensor]:
    """(response_ids, response_mask, sample_logprobs), each [N, T]; NaN log-prob after EOS.

    Top-k, then top-p, filter the temperature-scaled distribution (vLLM's order); the recorded
    log-prob is the token's under the unfiltered distribution. ``greedy`` takes the argmax.
    ``generator`` is one generator for the whole batch, or one per group (group_generators).
    ``max_total_tokens`` shares one budget between a row's prompt and its response
    (``response_caps``); a row that reaches it ends as one that reaches ``max_new_tokens``.
    ``kernels`` is the engine's ``sampling.kernels`` execution option: ``"exact"`` samples
    bit for bit as every earlier run of this engine did; ``"fast"`` decodes through
    fast_decode (fewer operators, only the rows still generating), whose rounding differs in
    the last bits (tests/test_native_fast_kernels.py bounds it and says where a seed's
    trajectories may part from exact's).
    """
    if kernels not in KERNELS:
        raise ValueError(f"sampling kernels {kernels!r}: one of {', '.join(KERNELS)}")
    # the model's own forward samples in eval mode; the grouped forward has no mode to set
    # (it runs only for models without dropout), and setting one walks every module twice
    toggled = model.training and not grouped_llama.supports(model)
    if toggled:
        model.eval()
    device = prompt_ids.device
    n = prompt_ids.shape[0]
    logits, advance = _decoder(model, prompt_ids, prompt_mask, group_size, max_new_tokens,
                               kernels)
    u = None if greedy else uniforms(generator, n, max_new_tokens, group_size)
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    caps = None if max_total_tokens is None else \
        response_caps(prompt_mask, max_new_tokens, max_total_tokens)
    ids, masks, logps = [], [], []
    for step in range(max_new_tokens):
        log_probs = torch.log_softmax(_scaled(logits, temperature), dim=-1)
        if greedy:
            token = log_probs.argmax(-1)
        else:
            probs = _top_p_filter(_top_k_filter(log_probs.exp(), top_k), top_p)
            assert u is not None
            token = draw(probs, u[:, step])
        lp = log_probs.gather(-1, token[:, None]).squeeze(-1)
        ids.append(token.masked_fill(finished, pad_id))
        masks.append((~finished).float())
        logps.append(lp.masked_fill(finished, float("nan")))
        finished = finished | (token == eos_id)
        if caps is not None:
            finished = finished | (caps <= step + 1)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        logits = advance(ids[-1], ~finished)
    if toggled:
        model.train()
    return torch.stack(ids, 1), torch.stack(masks, 1), torch.stack(logps, 1)


def response_caps(prompt_mask: Tensor, max_new_tokens: int, max_total_tokens: int) -> Tensor:
    """Each row's most response tokens: what its prompt leaves of ``max_total_tokens``, at
    most ``max_new_tokens``, and at least one (a row with no response token is no sample;
    the batch check refuses it)."""
    left = max_total_tokens - prompt_mask.long().sum(-1)
    return left.clamp(min=1, max=max_new_tokens)


def response_logprobs(model: Any, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                      response_mask: Tensor, temperature: float,
                      group_size: int = 1) -> tuple[Tensor, Tensor]:
    """Learner-side (log-prob, entropy) of each response token, with gradients. Padding
    positions hold finite values of no meaning (0 past a packed chunk's longest response,
    ``_packed``): the loss masks them.

    Uses the same shared-prompt prefill as sampling; gradients flow through the shared
    prompt keys and values into every sample of the group.
    """
    logp, entropy = _token_stats(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                 temperature, group_size, entropy=True)
    assert entropy is not None
    return logp, entropy


def response_token_logprobs(model: Any, prompt_ids: Tensor, prompt_mask: Tensor,
                            response_ids: Tensor, response_mask: Tensor, temperature: float,
                            group_size: int = 1) -> Tensor:
    """The log-prob of each response token alone: what the KL reference needs (its entropy
    would be a pass over the whole vocabulary per token, computed to be thrown away)."""
    return _token_stats(model, prompt_ids, prompt_mask, response_ids, response_mask,
                        temperature, group_size, entropy=False)[0]


def _token_stats(model: Any, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                 response_mask: Tensor, temperature: float, group_size: int, *,
                 entropy: bool) -> tuple[Tensor, Tensor | None]:
    """([N, T] log-prob of each response token, [N, T] entropy of its distribution or None),
    temperature applied."""
    if grouped_llama.supports(model):
        lean = grouped_llama.GroupedLlama.of(model)
        chunks = _packed(response_mask)
        if chunks is not None:
            return _packed_stats(lean, prompt_ids, prompt_mask, response_ids, temperature,
                                 group_size, chunks, entropy=entropy)
        logits = _grouped_logits(lean, prompt_ids, prompt_mask, response_ids, group_size)
    else:
        logits = _own_logits(model, prompt_ids, prompt_mask, response_ids, response_mask,
                             group_size)
    return _stats(logits, response_ids, temperature, entropy=entropy)


def _stats(logits: Tensor, response_ids: Tensor, temperature: float, *,
           entropy: bool) -> tuple[Tensor, Tensor | None]:
    log_probs = torch.log_softmax(_scaled(logits, temperature), dim=-1)
    spread = -(log_probs.exp() * log_probs).sum(-1) if entropy else None
    return log_probs.gather(-1, response_ids[..., None]).squeeze(-1), spread


# rows per chunk of the packed learner (``_packed``)
PACK_ROWS = 32


def _packed(response_mask: Tensor) -> list[tuple[Tensor, int]] | None:
    """The learner's rows in chunks of similar response lengths, longest first, each with
    the positions it needs (its longest response); None for short responses, where the
    batch runs whole.

    A response ends at its EOS and the positions after it are padding up to the batch's
    longest response: with 128-token completions from the tiny model a quarter of the
    positions were padding, with 512-token ones most of them, and the learner (and the KL
    reference) spent that share of its products and attention on positions the loss
    multiplies by zero. Each chunk runs only as far as its own longest response, and a chunk
    of a few dozen rows keeps its activations in the caches where the whole batch's did not:
    even without padding, the chunks took a tenth less time than the batch at once.

    Only where the fused attention would run anyway (long responses): each row then reads
    its group's prompt keys through it, as whole groups do. The numbers at real positions
    are those of the unpacked forward up to float32 rounding (the products sum over other
    rows and other lengths; the tests bound the difference)."""
    n, t = response_mask.shape
    if t < grouped_llama.FUSED_FROM_TOKENS or n < 2 * PACK_ROWS:
        return None
    lengths = (response_mask > 0).sum(-1).clamp(min=1)
    order = torch.argsort(lengths, descending=True, stable=True)
    return [(rows, int(lengths[rows[0]]))
            for rows in order.tensor_split(-(-n // PACK_ROWS))]


def _packed_stats(lean: grouped_llama.GroupedLlama, prompt_ids: Tensor, prompt_mask: Tensor,
                  response_ids: Tensor, temperature: float, group_size: int,
                  chunks: list[tuple[Tensor, int]], *,
                  entropy: bool) -> tuple[Tensor, Tensor | None]:
    """``_token_stats`` chunk by chunk (``_packed``), each chunk's rows reading their groups'
    prompt keys, padded back to [N, T] with zeros and put back in the batch's row order."""
    joined = lean.joined()
    prompt = _encode_prompts(lean, prompt_ids, prompt_mask, group_size, joined)
    first = lean.logits(prompt.last_hidden)
    start = prompt_mask.long().sum(-1)
    t = response_ids.shape[1]
    logps, spreads = [], []
    for rows, longest in chunks:
        groups = rows // group_size
        logits = first.index_select(0, groups)[:, None]
        if longest > 1:
            positions = start[rows, None] + torch.arange(longest - 1, device=rows.device)
            hidden = lean.extend(prompt, group_size, response_ids[rows, :longest - 1],
                                 positions, joined=joined, groups=groups)
            logits = torch.cat([logits, lean.logits(hidden)], dim=1)
        logp, spread = _stats(logits, response_ids[rows, :longest], temperature,
                              entropy=entropy)
        logps.append(F.pad(logp, (0, t - longest)))
        if spread is not None:
            spreads.append(F.pad(spread, (0, t - longest)))
    back = torch.cat([rows for rows, _ in chunks]).argsort()
    return torch.cat(logps)[back], torch.cat(spreads)[back] if spreads else None


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """``logits.float() / temperature``, without the operators that would return their input
    unchanged (a float32 cast of float32 logits, a division by 1)."""
    logits = logits if logits.dtype == torch.float32 else logits.float()
    return logits if temperature == 1.0 else logits / temperature


def _own_logits(model: Any, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
                response_mask: Tensor, group_size: int) -> Tensor:
    """Through the model's own forward: the shared prompt's cache expanded to the group."""
    first_logits, cache, prompt_len = _prefill(model, prompt_ids, prompt_mask, group_size)
    logits = first_logits[:, None, :]
    t = response_ids.shape[1]
    if t > 1:
        attn = torch.cat([prompt_mask, response_mask[:, :-1]], dim=1).long()
        positions = prompt_len[:, None] + torch.arange(t - 1, device=prompt_ids.device)
        out = model(input_ids=response_ids[:, :-1], attention_mask=attn,
                    position_ids=positions, use_cache=True, **{_cache_name(model): cache})
        logits = torch.cat([logits, out.logits], dim=1)
    return logits


def _grouped_logits(lean: grouped_llama.GroupedLlama, prompt_ids: Tensor, prompt_mask: Tensor,
                    response_ids: Tensor, group_size: int) -> Tensor:
    """Through the grouped forward: the prompt once per group, and the response tokens
    against it in place (the same numbers, without the per-sample copies)."""
    joined = lean.joined()
    prompt = _encode_prompts(lean, prompt_ids, prompt_mask, group_size, joined)
    logits = lean.first_logits(prompt, group_size)[:, None]
    t = response_ids.shape[1]
    if t > 1:
        start = prompt_mask.long().sum(-1)[:, None]
        positions = start + torch.arange(t - 1, device=prompt_ids.device)
        hidden = lean.extend(prompt, group_size, response_ids[:, :-1], positions,
                             joined=joined)
        logits = torch.cat([logits, lean.logits(hidden)], dim=1)
    return logits


def _encode_prompts(lean: grouped_llama.GroupedLlama, prompt_ids: Tensor, prompt_mask: Tensor,
                    group_size: int,
                    joined: list[grouped_llama.Joined] | None = None) -> grouped_llama.PromptKeys:
    """Each group's prompt once (rows come in contiguous groups of one prompt)."""
    ids, mask = prompt_ids[::group_size], prompt_mask[::group_size]
    return lean.encode_prompts(ids, mask, positions_from_mask(mask), joined)
