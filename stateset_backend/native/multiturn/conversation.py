"""Multi-turn rollouts: the policy talks with an environment, one KV cache for the whole talk.

A batch of conversations runs in lockstep, one assistant turn at a time. Every token enters
the model's KV cache exactly once: sampled tokens as they are sampled, the environment's
observation tokens appended to the cached sequence after each turn (never re-encoding the
conversation). Rows of different lengths share one cache: a finished row's columns and the
padding of observation blocks carry attention 0, positions count only real tokens, and
observation blocks are left-padded so every row's last column is its last real token.

Each token is recorded with its role (environment context or the assistant's own sample), the
assistant turn it belongs to, and its log-prob at sampling time. Only assistant tokens ever
carry loss; ``batch.check_conversation_batch`` proves it per batch.

The plain-text turn format (no chat template; docs/environments.md) is::

    [BOS] tools: NAME PARAM ... user: TEXT assistant: SAMPLED [EOS] tool: NAME TEXT assistant: ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from stateset_backend.native import objectives
from stateset_backend.native.batch import (
    ROLE_ASSISTANT,
    ROLE_ENVIRONMENT,
    ROLE_PAD,
    ConversationBatch,
)
from stateset_backend.native.multiturn.environment import (
    Failure,
    Tool,
    Workers,
    check_opening,
    check_step,
)
from stateset_backend.native.rollout import (
    _cache_name,
    _top_k_filter,
    _top_p_filter,
    positions_from_mask,
)

ROLE_TAGS = {"system": "system:", "user": "user:", "assistant": "assistant:", "tool": "tool:"}
TOOLS_TAG = "tools:"
FORMAT_WORDS = [*ROLE_TAGS.values(), TOOLS_TAG]


# -- the plain-text format -----------------------------------------------------------------
def render_tools(tools: list[Tool]) -> str:
    return " ".join(f"{TOOLS_TAG} {t.name} {' '.join(t.parameters)}".strip() for t in tools)


def render_message(msg: dict[str, Any]) -> str:
    """One message as text. An assistant tool call renders as ``NAME VALUE ...`` in the
    order of the tool's parameters, exactly what the policy samples to make one."""
    role = msg["role"]
    if role == "tool":
        return f"{ROLE_TAGS['tool']} {msg['name']} {msg['content']}"
    if role == "assistant" and msg.get("tool_calls"):
        call = msg["tool_calls"][0]
        values = " ".join(str(v) for v in call["arguments"].values())
        return f"{ROLE_TAGS['assistant']} {call['name']} {values}".rstrip()
    return f"{ROLE_TAGS[role]} {msg['content']}"


def render_context(messages: list[dict[str, Any]]) -> str:
    """Environment messages followed by the tag that opens the next assistant turn."""
    return " ".join([*(render_message(m) for m in messages), ROLE_TAGS["assistant"]])


def _convert(value: str, kind: str) -> Any:
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
    except ValueError:
        return value
    if kind == "boolean" and value in ("true", "false"):
        return value == "true"
    return value


def parse_assistant(text: str, tools: list[Tool]) -> dict[str, Any]:
    """The assistant's sampled text as a message. A turn whose first word names a declared tool
    is a call to it: the following words are its parameters' values in schema order, one word
    each, the last taking the rest (missing ones are left out; checking them is the
    environment's job)."""
    words = text.split()
    by_name = {t.name: t for t in tools}
    if not words or words[0] not in by_name:
        return {"role": "assistant", "content": text}
    tool, values = by_name[words[0]], words[1:]
    args: dict[str, Any] = {}
    for j, (name, kind) in enumerate(zip(tool.parameters, tool.types, strict=True)):
        if j >= len(values):
            break
        last = j == len(tool.parameters) - 1
        args[name] = _convert(" ".join(values[j:]) if last else values[j], kind)
    return {"role": "assistant", "content": text,
            "tool_calls": [{"name": tool.name, "arguments": args}]}


# -- limits --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    max_turns: int
    turn_tokens: int  # per assistant turn
    total_tokens: int  # the whole conversation
    opening_tokens: int  # the rendered opening (data.max_prompt_tokens)

    @classmethod
    def from_spec(cls, spec: Any) -> Limits:
        env, data = spec.environment, spec.data
        turn = env.max_turn_tokens or data.max_response_tokens
        total = env.max_total_tokens or data.max_prompt_tokens + env.max_turns * turn
        return cls(env.max_turns, turn, total, data.max_prompt_tokens)


@dataclass
class Conversation:
    """What happened in one conversation, kept for receipts and trajectories."""

    task_index: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    ended_by: str = ""  # done | max_turns | max_total_tokens | error
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def end(self, how: str, error: str | None = None) -> None:
        if not self.ended_by:
            self.ended_by, self.error = how, error


@dataclass
class Rollout:
    ids: Tensor  # [N, L] long
    attention: Tensor  # [N, L] float, 1 = a real token
    roles: Tensor  # [N, L] long: ROLE_PAD, ROLE_ENVIRONMENT or ROLE_ASSISTANT
    sample_logprobs: Tensor  # [N, L] float, NaN except on sampled tokens
    turn_ids: Tensor  # [N, L] long, assistant turn of each sampled token, -1 elsewhere
    conversations: list[Conversation]


@dataclass(frozen=True)
class Decoding:
    temperature: float  # 0 = greedy
    top_p: float
    top_k: int | None


class _Sequence:
    """The batch's token columns and the model's KV cache over them."""

    def __init__(self, model: Any, n: int, pad_id: int, device: torch.device) -> None:
        from transformers import DynamicCache

        self.model, self.pad_id, self.device = model, pad_id, device
        self.cache_arg = _cache_name(model)
        self.cache: Any = DynamicCache()
        self.cached = 0
        self.logits: Tensor | None = None
        z = torch.zeros((n, 0), device=device)
        self.ids, self.attn, self.roles = z.long(), z.clone(), z.long()
        self.logps, self.turns = z.clone(), z.long()

    def append(self, ids: Tensor, attn: Tensor, role: int, logps: Tensor | None = None,
               turn: int = -1) -> None:
        real = attn.bool()
        self.ids = torch.cat([self.ids, torch.where(real, ids, self.pad_id)], 1)
        self.attn = torch.cat([self.attn, attn.float()], 1)
        self.roles = torch.cat([self.roles, torch.where(real, role, ROLE_PAD)], 1)
        nan = torch.full(ids.shape, float("nan"), device=self.device)
        self.logps = torch.cat([self.logps, nan if logps is None else
                                torch.where(real, logps, nan)], 1)
        self.turns = torch.cat([self.turns, torch.where(real, turn, -1)], 1)

    def append_block(self, rows: dict[int, list[int]], role: int = ROLE_ENVIRONMENT) -> None:
        """Left-padded token block: each listed row's tokens end in the last column."""
        n, width = self.ids.shape[0], max(len(t) for t in rows.values())
        ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=self.device)
        attn = torch.zeros((n, width), device=self.device)
        for i, toks in rows.items():
            if toks:
                ids[i, width - len(toks):] = torch.tensor(toks, device=self.device)
                attn[i, width - len(toks):] = 1.0
        self.append(ids, attn, role)

    def lengths(self) -> Tensor:
        return self.attn.sum(-1).long()

    def next_logits(self) -> Tensor:
        """Logits after every row's last column, feeding only the columns not yet cached."""
        width = self.ids.shape[1]
        if self.cached < width or self.logits is None:
            positions = positions_from_mask(self.attn)
            out = self.model(input_ids=self.ids[:, self.cached:],
                             attention_mask=self.attn.long(),
                             position_ids=positions[:, self.cached:], use_cache=True,
                             **{self.cache_arg: self.cache})
            self.cache = out[self.cache_arg]
            self.logits = out.logits[:, -1, :].float()
            self.cached = width
        return self.logits


def _pick(logits: Tensor, decoding: Decoding, generator: torch.Generator | None) -> tuple[Tensor,
                                                                                         Tensor]:
    log_probs = torch.log_softmax(logits / (decoding.temperature or 1.0), dim=-1)
    if decoding.temperature == 0:
        token = log_probs.argmax(-1)
    else:
        probs = _top_p_filter(_top_k_filter(log_probs.exp(), decoding.top_k), decoding.top_p)
        token = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1)
        token = token.to(logits.device)
    return token, log_probs.gather(-1, token[:, None]).squeeze(-1)


@torch.no_grad()
def roll_out(model: Any, tokenizer: Any, workers: Workers, tasks: list[dict[str, Any]],
             task_indices: list[int], tools: list[Tool], limits: Limits, decoding: Decoding,
             generator: torch.Generator | None) -> Rollout:
    """Run one conversation per task (worker i holds conversation i) to its end."""
    was_training = model.training
    model.eval()
    n = len(tasks)
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    convs = [Conversation(task_indices[i]) for i in range(n)]
    openings: dict[int, list[int]] = {}
    results = workers.call("reset", dict(enumerate(tasks)))
    for i in range(n):
        opening = check_opening(results[i]) if not isinstance(results[i], Failure) \
            else results[i]
        if isinstance(opening, Failure):
            convs[i].end("error", opening.reason)
            openings[i] = [bos]  # a placeholder row that never samples
            continue
        convs[i].messages.extend(opening)
        head = [bos] if bos is not None else []
        toks = head + encode(" ".join(filter(None, [render_tools(tools),
                                                    render_context(opening)])))
        if len(toks) > limits.opening_tokens:
            convs[i].end("error", f"the opening has {len(toks)} tokens, over "
                                  f"data.max_prompt_tokens {limits.opening_tokens}")
            toks = [bos]
        openings[i] = toks
    device = next(model.parameters()).device
    seq = _Sequence(model, n, pad, device)
    seq.append_block(openings)
    for turn in range(limits.max_turns):
        lengths = seq.lengths()
        for i, conv in enumerate(convs):
            if not conv.ended_by and int(lengths[i]) + limits.turn_tokens > limits.total_tokens:
                if conv.turn_rewards:
                    conv.end("max_total_tokens")
                else:
                    conv.end("error", "the opening leaves no room for an assistant turn "
                                      "within the conversation's total token limit")
        active = [i for i, c in enumerate(convs) if not c.ended_by]
        if not active:
            break
        live = torch.zeros(n, dtype=torch.bool, device=device)
        live[active] = True
        start = seq.ids.shape[1]
        for _ in range(limits.turn_tokens):
            token, logp = _pick(seq.next_logits(), decoding, generator)
            seq.append(token[:, None], live[:, None].float(), ROLE_ASSISTANT, logp[:, None],
                       turn)
            live = live & (token != eos)
            if not bool(live.any()):
                break
        for i in active:
            sampled = seq.ids[i, start:][seq.attn[i, start:].bool()].tolist()
            text = tokenizer.decode([t for t in sampled if t != eos], skip_special_tokens=True)
            convs[i].messages.append(parse_assistant(" ".join(text.split()), tools))
        steps = workers.call("step", {i: convs[i].messages for i in active})
        block: dict[int, list[int]] = {}
        lengths = seq.lengths()
        for i in active:
            conv = convs[i]
            step = check_step(steps[i]) if not isinstance(steps[i], Failure) else steps[i]
            if isinstance(step, Failure):
                conv.end("error", step.reason)
                continue
            conv.turn_rewards.append(step.reward)
            conv.messages.extend(step.observations)
            if step.done:
                conv.end("done")
            elif turn + 1 == limits.max_turns:
                conv.end("max_turns")
            else:
                toks = encode(render_context(step.observations))
                if int(lengths[i]) + len(toks) + limits.turn_tokens > limits.total_tokens:
                    conv.end("max_total_tokens")
                else:
                    block[i] = toks
        if not block:
            break
        seq.append_block(block)
    for conv in convs:
        conv.end("max_turns")
    if was_training:
        model.train()
    return Rollout(seq.ids.cpu(), seq.attn.cpu(), seq.roles.cpu(), seq.logps.cpu(),
                   seq.turns.cpu(), convs)


def conversation_logprobs(model: Any, ids: Tensor, attention: Tensor,
                          temperature: float) -> tuple[Tensor, Tensor]:
    """Learner-side (log-prob, entropy) of every token of whole conversations, from one full
    forward (column j holds token j's log-prob given everything before it; column 0 is 0)."""
    out = model(input_ids=ids, attention_mask=attention.long(),
                position_ids=positions_from_mask(attention))
    log_probs = torch.log_softmax(out.logits[:, :-1].float() / temperature, dim=-1)
    token_logp = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    zero = torch.zeros((ids.shape[0], 1), dtype=token_logp.dtype, device=ids.device)
    return torch.cat([zero, token_logp], 1), torch.cat([zero, entropy], 1)


def transcript(conv: Conversation) -> str:
    """The conversation in the plain-text format (for trajectories and people)."""
    return json.dumps([render_message(m) for m in conv.messages])


# -- one update's conversations ------------------------------------------------------------
class FailedShareExceeded(RuntimeError):
    """More of an update's conversations failed than environment.max_failed_share allows; the
    update is refused and nothing is applied."""


@dataclass
class Collected:
    """An update's conversations: the batch the learner may use, and the record of all."""

    batch: ConversationBatch | None
    conversations: list[Conversation]
    groups: list[int]  # the group of each conversation
    returns: list[float | None]  # None: no return (failed)
    excluded: dict[int, str]  # conversation -> why it carries no loss

    @property
    def failed(self) -> int:
        return sum(c.failed for c in self.conversations)

    @classmethod
    def join(cls, parts: list[Collected]) -> Collected:
        """The record of several collections as one (validation runs in chunks); the learner
        batch is not joined: validation learns nothing."""
        joined = cls(None, [], [], [], {})
        for part in parts:
            offset, group_offset = len(joined.conversations), \
                (max(joined.groups) + 1 if joined.groups else 0)
            joined.conversations += part.conversations
            joined.groups += [g + group_offset for g in part.groups]
            joined.returns += part.returns
            joined.excluded.update({n + offset: why for n, why in part.excluded.items()})
        return joined


def collect(model: Any, tokenizer: Any, workers: Workers, tools: list[Tool],
            limits: Limits, tasks: list[tuple[int, dict[str, Any]]], group_size: int,
            decoding: Decoding, generator: torch.Generator | None, *, placement: str,
            gamma: float, policy_version: int) -> Collected:
    """``group_size`` conversations per task, run to their ends, as a learner batch.

    A failed conversation (its environment raised, timed out or answered malformed output)
    carries no loss and has no return: nothing is invented for it. The rest of its group is
    compared among itself; a group left with a single conversation has no baseline and is
    excluded too.
    """
    rows = [(index, task) for index, task in tasks for _ in range(group_size)]
    rollout = roll_out(model, tokenizer, workers, [t for _, t in rows], [i for i, _ in rows],
                       tools, limits, decoding, generator)
    convs = rollout.conversations
    groups = [n // group_size for n in range(len(rows))]
    excluded = {n: f"environment failed: {c.error}" for n, c in enumerate(convs) if c.failed}
    for g in range(len(tasks)):
        alive = [n for n in range(g * group_size, (g + 1) * group_size) if n not in excluded]
        if len(alive) == 1 and group_size > 1:
            excluded[alive[0]] = "its group has no other conversation to compare with"
    k = max(1, max(len(c.turn_rewards) for c in convs))
    turn_rewards = torch.full((len(rows), k), float("nan"))
    for n, c in enumerate(convs):
        if not c.failed and c.turn_rewards:
            turn_rewards[n, :len(c.turn_rewards)] = torch.tensor(c.turn_rewards)
    returns_t = objectives.conversation_return(turn_rewards, placement, gamma)
    returns = [None if c.failed else float(returns_t[n]) for n, c in enumerate(convs)]
    keep = torch.tensor([n not in excluded for n in range(len(rows))])
    if not bool(keep.any()):
        return Collected(None, convs, groups, returns, excluded)
    assistant = (rollout.roles == ROLE_ASSISTANT).float()
    full = ConversationBatch(
        rollout.ids, rollout.attention, rollout.roles, assistant, rollout.sample_logprobs,
        rollout.turn_ids, turn_rewards, torch.tensor(groups),
        torch.tensor([i for i, _ in rows]), torch.arange(len(rows)), returns_t.float(),
        policy_version)
    return Collected(full.select(keep), convs, groups, returns, excluded)


def refuse_failed_share(collected: Collected, max_failed_share: float, *,
                        what: str = "update") -> None:
    """Raise when more conversations failed than allowed, naming the first failure; outside
    training (``what`` names the split) also when every one failed: no reward is left."""
    total = len(collected.conversations)
    failed = collected.failed
    share = failed / total if total else 1.0
    every = what != "update" and failed == total
    if share <= max_failed_share and not every:
        return
    first = next((c for c in collected.conversations if c.failed), None)
    if share > max_failed_share:
        head = (f"{what}: {failed} of {total} conversations failed in the environment (share "
                f"{share:.3f} > environment.max_failed_share {max_failed_share}); ")
        head += "the update was refused and nothing was applied" if what == "update" else \
            "its reward would be a mean over the survivors only, so none is reported"
    else:
        head = (f"{what}: every one of {total} conversations failed in the environment; "
                "there is no reward to report")
    raise FailedShareExceeded(head + ". First failure" + (
        f" (task row {first.task_index}): {first.error}" if first else ": none"))
