"""Rules every external engine shares, written once.

verl, OpenRLHF and NeMo RL (and third-party engines) answer many leaves the same way: the hub
checks every pinned file itself, a python reward goes through one generated shim, an engine
that loads ``model.path`` as given gets the pinned snapshot's path, and no external engine picks
a checkpoint by a validation metric. An adapter starts from ``external_rules(label)`` and adds
its own keys: ``{**external_rules("verl"), ...}``.
"""

from __future__ import annotations

from typing import Any

from .hub import revision_outcome
from .rules import Outcome, Pinned, Refused, Rule, carried, na, only, refuse
from .spec import ExperimentSpec

VERIFIED = "checked against the file's sha256 by stateset-backend before launch"


def external_rules(engine: str) -> dict[str, Rule]:
    """The leaves an external engine answers like every other; ``engine`` is its display name."""
    verified = carried(VERIFIED)
    return {
        "name": na("the engine's run name carries the run id and experiment digest instead"),
        "model.revision": revision_outcome(engine),
        "data.train.sha256": verified,
        "data.validation.sha256": verified,
        "reward.kind": only(lambda v: v == "python", f"only python rewards are translated for "
                            f"{engine}", carried("a python reward, through the generated "
                                                 "reward shim")),
        "reward.sha256": carried(VERIFIED + ", and again by the reward shim where it scores"),
        "environment": refuse(f"conversations with an environment are not translated for "
                              f"{engine}"),
        "environment.kind": only(lambda v: v == "single_turn", "multi-turn environments are "
                                 f"not translated for {engine}", carried("single-turn rollout")),
        "environment.max_turns": carried("single-turn: one response per prompt"),
        "evaluation.select_by": refuse_selection(engine),
    }


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
