"""Field rules: for one engine version, what happens to every leaf of the spec.

Every leaf is either mapped onto native keys, rejected with a reason, or not applicable with a
reason. ``explain`` and ``translate`` both read the same rules, so what ``explain`` shows is
exactly what runs, and a leaf with no rule is an adapter bug that stops the launch instead of
being silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput, Unsupported
from .modeltree import leaves
from .spec import ExperimentSpec


@dataclass(frozen=True)
class Mapped:
    native: dict[str, Any]


@dataclass(frozen=True)
class Rejected:
    reason: str


@dataclass(frozen=True)
class NotApplicable:
    reason: str


Outcome = Mapped | Rejected | NotApplicable
Rule = Callable[[Any, ExperimentSpec], Outcome]
RuleSet = Mapping[str, Rule]


# -- rule builders -------------------------------------------------------------------------
def to(*keys: str, convert: Callable[[Any], Any] | None = None) -> Rule:
    """Map a leaf onto one or more native keys (the same value under each)."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native_value = convert(value) if convert is not None else value
        return Mapped({k: native_value for k in keys})

    return rule


def na(reason: str) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return NotApplicable(reason)

    return rule


def reject(reason: str) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Rejected(reason)

    return rule


def only(allowed: Callable[[Any], bool], reason: str, then: Rule) -> Rule:
    """Apply ``then`` when the value is one the engine can honour, else reject with reason."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return then(value, spec) if allowed(value) else Rejected(reason)

    return rule


def when_set(then: Rule, unset: Rule) -> Rule:
    """Dispatch on whether an optional section is present (null means 'off')."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return unset(value, spec) if value is None else then(value, spec)

    return rule


def zero_variance_rule(engine: str, refill: str, when_excluded: dict[str, Any]) -> Rule:
    """Engines exclude zero-variance groups only while refilling the batch (``refill`` names
    their dynamic-sampling feature); keeping them needs nothing."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "keep":
            return NotApplicable(f"{engine} keeps zero-variance groups (their advantages are 0)")
        if spec.algorithm.dynamic_sampling is None:
            return Rejected(f"{engine} excludes zero-variance groups only with {refill}")
        return Mapped(dict(when_excluded))

    return rule


def with_owned_keys(engine: str, native: dict[str, Any],
                    owned: dict[str, Any]) -> dict[str, Any]:
    """``native`` plus the keys the core sets for identity and outputs, which no
    ``engine_options`` entry may override."""
    taken = sorted(set(owned) & set(native))
    if taken:
        raise InvalidInput(f"engine_options.{engine}.{taken[0]}: set by stateset-backend to keep "
                           "the run's identity and outputs; it cannot be overridden")
    return {**native, **owned}


# Leaves the core itself accounts for; adapters never see them.
CORE_HANDLED: dict[str, str] = {
    "labels": "recorded in the run store, not passed to the engine",
    "engine_options": "merged as raw native keys after the mapped fields",
}


def rule_for(rules: RuleSet, path: str) -> Rule | None:
    """The rule for a leaf: an exact entry, else the longest dotted prefix."""
    probe = path
    while True:
        if probe in rules:
            return rules[probe]
        if "." not in probe:
            return None
        probe = probe.rsplit(".", 1)[0]


@dataclass(frozen=True)
class FieldRow:
    path: str
    value: Any
    outcome: Outcome | None  # None: the adapter has no rule (a bug)
    core_reason: str | None = None


def explain_rows(spec: ExperimentSpec, rules: RuleSet) -> list[FieldRow]:
    rows: list[FieldRow] = []
    for path, value in leaves(spec):
        if path in CORE_HANDLED:
            rows.append(FieldRow(path, value, NotApplicable(CORE_HANDLED[path]),
                                 CORE_HANDLED[path]))
            continue
        rule = rule_for(rules, path)
        rows.append(FieldRow(path, value, rule(value, spec) if rule else None))
    return rows


@dataclass(frozen=True)
class Translation:
    native: dict[str, Any]
    sources: dict[str, str]  # native key -> spec path (or engine_options)


def translate(spec: ExperimentSpec, rules: RuleSet, engine: str, version: str) -> Translation:
    """Apply the rules; refuse on any rejection, unruled leaf or engine_options override."""
    native: dict[str, Any] = {}
    sources: dict[str, str] = {}
    rejected: list[str] = []
    for row in explain_rows(spec, rules):
        if row.outcome is None:
            rejected.append(f"{row.path}: the {engine} adapter has no rule for this field")
        elif isinstance(row.outcome, Rejected):
            rejected.append(f"{row.path}: {row.outcome.reason}")
        elif isinstance(row.outcome, Mapped):
            for key, value in row.outcome.native.items():
                if key in native and native[key] != value:
                    raise Unsupported(f"{engine} adapter maps {sources[key]} and {row.path} "
                                      f"onto {key} with different values")
                native[key] = value
                sources[key] = row.path
    if rejected:
        raise Unsupported(f"{engine} {version} cannot honour: " + "; ".join(rejected),
                          details={"rejected": rejected})
    for key, value in spec.engine_options.get(engine, {}).items():
        if key in sources:
            raise InvalidInput(f"engine_options.{engine}.{key}: overrides the key that "
                               f"{sources[key]} maps to; change {sources[key]} instead")
        native[key] = value
        sources[key] = f"engine_options.{engine}"
    return Translation(native, sources)
