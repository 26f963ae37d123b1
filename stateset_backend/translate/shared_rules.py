"""Rules every external engine shares, written once.

verl, OpenRLHF and NeMo RL (and third-party engines) answer many leaves the same way: the hub
checks every pinned file itself, a python reward goes through one generated shim, an engine
that loads ``model.path`` as given gets the pinned snapshot's path, and no external engine picks
a checkpoint by a validation metric. An adapter starts from ``external_rules(label)`` and adds
its own keys: ``{**external_rules("verl"), ...}``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.spec.inputs import local_path, resolved
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.hub import revision_outcome
from stateset_backend.translate.rules import (
    Hardcoded,
    NotApplicable,
    Outcome,
    Pinned,
    Refused,
    Rule,
    carried,
    hardcoded,
    na,
    only,
    refuse,
)

VERIFIED = "checked against the file's sha256 by stateset-backend before launch"


def external_rules(engine: str) -> dict[str, Rule]:
    """The leaves an external engine answers like every other; ``engine`` is its display name."""
    verified = carried(VERIFIED, hub=True)
    return {
        "name": na("the engine's run name carries the run id and experiment digest instead"),
        "model.revision": revision_outcome(engine),
        "data.train.sha256": verified,
        "data.validation.sha256": verified,
        "reward.kind": only(lambda v: v == "python", f"only python rewards are translated for "
                            f"{engine}", carried("a python reward, through the generated "
                                                 "reward shim", hub=True)),
        "reward.sha256": carried(VERIFIED + ", and again by the reward shim where it scores",
                                 hub=True),
        "environment": refuse(f"conversations with an environment are not translated for "
                              f"{engine}"),
        "environment.kind": only(lambda v: v == "single_turn", "multi-turn environments are "
                                 f"not translated for {engine}", carried("single-turn rollout")),
        "environment.max_turns": lambda v, s: carried("single-turn: one response per prompt")(
            v, s) if s.environment.kind == "single_turn" else Refused(
            f"multi-turn environments are not translated for {engine}"),
        "evaluation.select_by": refuse_selection(engine),
        "algorithm.sft": refuse(f"supervised fine-tuning (objective sft) is not translated for "
                                f"{engine}; run it on the native engine"),
        "model.from_run": only(lambda v: v is None, f"{engine} cannot start from a stored run's "
                               "checkpoint (model.from_run); export its weights to a model "
                               "directory and name that in model.path",
                               carried("the weights are model.path's")),
        "resources.processes_per_node": one_process_per_gpu(engine),
    }


def rl_objective(engine: str, rule: Rule) -> Rule:
    """An RL engine's rule for ``algorithm.objective``: supervised fine-tuning is refused
    before the engine's objective table is consulted."""

    def guarded(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "sft":
            return Refused(f"{engine} is run here for RL objectives only: supervised "
                           "fine-tuning (objective sft) runs on the native engine")
        return rule(value, spec)

    return guarded


def one_process_per_gpu(engine: str) -> Rule:
    """External engines start one training process per GPU themselves; a different count is
    not something their launchers take."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        gpus = spec.resources.gpus_per_node
        if value is None or value == gpus:
            return NotApplicable(f"{engine} starts one process per GPU "
                                 "(resources.gpus_per_node)")
        return Refused(f"{engine} starts one process per GPU: set resources.gpus_per_node "
                       "instead of processes_per_node")

    return rule


def gpu_workers(engine: str, key: str) -> Rule:
    """``resources.gpus_per_node`` for an engine that places each training process on a GPU
    of a placement group (verl, OpenRLHF, NeMo RL): with none per node the group is empty,
    and the launch can never be scheduled, on any machine. Refused before the queue wait
    instead of found after it; the spec's default of 0 is the native engine's CPU run."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value < 1:
            return Refused(f"{engine} runs each training process on a GPU: "
                           f"resources.gpus_per_node {value} leaves its placement group empty, "
                           "a launch no machine can run")
        return Pinned({key: value})

    return rule


def refuse_selection(engine: str) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Refused(f"{engine} does not pick a checkpoint by a validation metric; set "
                       "evaluation.select_by to null")

    return rule


def disabled_when_none(key: str, off: Any) -> Rule:
    """A period whose null means 'never' (checkpoints, validation): the engine's own 'never'."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({key: off if value is None else value})

    return rule


def even_split(total: int, parts: int, unit: str) -> Refused | None:
    """Mini-batches must be equal: an engine that sizes them in ``unit`` needs divisibility."""
    if total % parts:
        return Refused(f"{total} {unit} per update do not split into {parts} equal "
                       "mini-batches")
    return None


def zero_variance_rule(engine: str, refill: str, when_excluded: dict[str, Any]) -> Rule:
    """Engines exclude zero-variance groups only while refilling the batch (``refill`` names
    their dynamic-sampling feature); kept groups get advantage 0 on every engine."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "keep":
            return Pinned({}, f"{engine} keeps zero-variance groups (their advantages are 0)")
        if spec.algorithm.dynamic_sampling is None:
            return Refused(f"{engine} excludes zero-variance groups only with {refill}")
        return Pinned(dict(when_excluded))

    return rule


# -- conversations (multi_turn / tool_use) on external engines ------------------------------
# Every external engine runs the spec's environment through a fixed shim of ours
# (adapters/agent_shims): the same worker process, deadline, checks and failure rule on each.
CONVERSATION_FILE = "stateset_conversation.json"
FAILURE_LOG = "environment-failures.jsonl"
SHIM_CARRIED = ("the environment class is imported by path in the shim's worker process, "
                "after its sha256 is checked again there")
MASKED = ("only the assistant's sampled tokens carry loss: openings, observations and tool "
          "results are context")


def is_conversation(spec: ExperimentSpec) -> bool:
    return spec.environment.kind != "single_turn"


def turn_limit(spec: ExperimentSpec) -> int:
    """Tokens per assistant turn: environment.max_turn_tokens, else data.max_response_tokens."""
    return spec.environment.max_turn_tokens or spec.data.max_response_tokens


def total_limit(spec: ExperimentSpec) -> int:
    """Tokens of a whole conversation (opening, assistant and environment tokens)."""
    env = spec.environment
    return env.max_total_tokens or spec.data.max_prompt_tokens + env.max_turns * turn_limit(spec)


def conversation_settings(spec: ExperimentSpec, environment_file: str, model: str,
                          splits: dict[str, dict[str, str]]) -> dict[str, Any]:
    """What the shims read (as JSON, never as source): the environment's file, class and
    digest, the limits, the reward placement, the deadline and the splits to convert."""
    env = spec.environment
    assert env.entrypoint is not None and env.sha256 is not None
    return {"environment": {"path": environment_file,
                            "class": env.entrypoint.rpartition(":")[2], "sha256": env.sha256},
            "max_turns": env.max_turns, "max_turn_tokens": turn_limit(spec),
            "max_total_tokens": total_limit(spec), "max_prompt_tokens": spec.data.max_prompt_tokens,
            "reward_placement": env.reward_placement, "turn_discount": env.turn_discount,
            "step_timeout_s": env.step_timeout_s, "max_failed_share": env.max_failed_share,
            "model": model, "splits": splits}


def local_splits(spec: ExperimentSpec, base_dir: Path, engine: str,
                 *fields: str) -> dict[str, dict[str, str]]:
    """The train and validation files an engine's launcher converts, with the named row fields
    (e.g. ``prompt_field``); a split that is not a local file cannot be converted."""
    splits = {}
    for name in ("train", "validation"):
        split = getattr(spec.data, name)
        if split is not None:
            source = local_path(split.uri, base_dir)
            if source is None:
                raise InvalidInput(f"data.{name}.uri: the {engine} launch converts local split "
                                   "files only")
            splits[name] = {"source": str(resolved(f"data.{name}.uri", source)),
                            **{f: getattr(split, f) for f in fields}}
    return splits


def environment_file(spec: ExperimentSpec, base_dir: Path) -> str:
    """The environment class's file, which the shims load by path (never as source)."""
    assert spec.environment.entrypoint is not None
    path = local_path(spec.environment.entrypoint.rpartition(":")[0], base_dir)
    if path is None:
        raise InvalidInput("environment.entrypoint: the environment file must be local")
    return str(resolved("environment.entrypoint", path))


def by_conversation(single: Rule, conversation: Rule) -> Rule:
    """A leaf answered one way for single-turn specs and another for conversations."""
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return (conversation if is_conversation(spec) else single)(value, spec)

    return rule


def _conversation_refusals(spec: ExperimentSpec, engine: str) -> list[str]:
    """Settings whose single-response meaning does not carry over to a conversation (the
    native engine refuses the same ones)."""
    alg, problems = spec.algorithm, []
    if alg.kl is not None and alg.kl.placement == "reward":
        problems.append("algorithm.kl.placement reward: for conversations KL goes in the loss "
                        "only")
    if alg.overlong is not None:
        problems.append("algorithm.overlong: the overlong penalty is defined on one response")
    if alg.dynamic_sampling is not None:
        problems.append("algorithm.dynamic_sampling: batches of conversations are not refilled")
    if spec.data.prompt_overflow in ("truncate_left", "truncate_right"):
        problems.append(f"data.prompt_overflow {spec.data.prompt_overflow}: an opening is never "
                        "truncated")
    if not spec.data.chat_template:
        problems.append(f"data.chat_template false: the {engine} shim renders conversations "
                        "with the model's chat template")
    return problems


def conversation_rules(engine: str, switch: Callable[[ExperimentSpec], dict[str, Any]],
                       turns: Callable[[ExperimentSpec], dict[str, Any]] | None = None,
                       turn_tokens: Callable[[ExperimentSpec], dict[str, Any]] | None = None,
                       total_tokens: Callable[[ExperimentSpec], dict[str, Any]] | None = None,
                       cuts_turns_at_total: bool = False) -> dict[str, Rule]:
    """The environment leaves on an external engine whose shim runs conversations.

    ``switch`` gives the native keys that hand rollouts to the shim; ``turns``,
    ``turn_tokens`` and ``total_tokens`` the engine's own keys for the limits, where its loop
    reads them (the shim enforces every limit itself as well). ``cuts_turns_at_total``: the
    engine's own loop starts a turn with fewer than the turn limit left and cuts it at the
    total (declared as ``turn_cut_at_total_limit``), where the native engine ends the
    conversation instead."""

    def kind(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "single_turn":
            return Pinned({}, "single-turn rollout")
        problems = _conversation_refusals(spec, engine)
        if problems:
            return Refused("; ".join(problems))
        return Pinned(switch(spec), f"the {engine} shim runs each conversation; {MASKED}")

    def keys(native: Callable[[ExperimentSpec], dict[str, Any]] | None, how: str) -> Rule:
        def rule(value: Any, spec: ExperimentSpec) -> Outcome:
            keys = native(spec) if native else {}
            conversation = is_conversation(spec)
            return Pinned(keys, how if conversation else
                          "single-turn: one response per prompt",
                          hub=conversation and not keys)  # the shim alone enforces it

        return rule

    def total(value: Any, spec: ExperimentSpec) -> Outcome:
        native = total_tokens(spec) if total_tokens else {}
        if cuts_turns_at_total:
            return Hardcoded("a last turn may start with fewer tokens left and is cut at the "
                             "total", "turn_cut_at_total_limit", native)
        return Pinned(native, f"{total_limit(spec)} tokens, counting the opening, every "
                              "assistant turn and every observation; a turn starts only if a "
                              "whole turn still fits")

    return {
        "environment.kind": kind,
        "environment.entrypoint": carried(SHIM_CARRIED, hub=True),
        "environment.sha256": carried(VERIFIED + ", and again by the shim's worker", hub=True),
        "environment.max_turns": keys(turns, "the shim ends a conversation after max_turns "
                                             "assistant turns"),
        "environment.max_turn_tokens": keys(turn_tokens, "each turn samples at most the turn "
                                                         "limit"),
        "environment.max_total_tokens": total,
        "environment.reward_placement": hardcoded(
            "final", "per_turn_credit_is_the_return"),
        "environment.turn_discount": carried("the shim's return G_0 = sum_k gamma^k r_k",
                                             hub=True),
        "environment.step_timeout_s": carried("the shim kills a worker that misses the "
                                              "deadline and records the failure", hub=True),
        "environment.max_failed_share": only(
            lambda v: v == 0, f"{engine} cannot leave a failed conversation out of its "
            "group's baseline; only max_failed_share 0 (the first failure stops the run) is "
            "honoured", carried(f"the first environment failure stops the run before its "
                                f"update, recorded in {FAILURE_LOG}", hub=True)),
        "reward.kind": lambda v, s: Pinned({}, f"the environment's rewards, through the "
                                               f"{engine} shim", hub=True)
        if v == "environment" else external_rules(engine)["reward.kind"](v, s),
    }
