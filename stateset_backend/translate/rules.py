"""The rule kit: for one engine release, what every leaf of the spec becomes.

Each leaf that describes the experiment ends in exactly one of three states on every engine:

- **pinned**: the launch sets the engine's own key to the spec's value, explicitly, even when
  the engine's default agrees today (a default is a release's choice, not ours);
- **refused**: the engine cannot do what the spec asks; nothing launches (exit 3);
- **declared**: the engine hard-codes another behaviour, and the dialect names and quantifies
  the deviation; ``explain`` shows it, plan and result record it, ``equivalence: strict``
  refuses it.

There is no fourth state: a rule that says "not applicable" for an identity leaf is an adapter
bug and stops the launch. Leaves the spec itself makes moot (the test split, the validation
decoding of a run that never validates) are *inert* on every engine alike, decided here once.
``explain`` and translation read the same rows, so what ``explain`` shows is what runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from stateset_backend.common.display import problems_text
from stateset_backend.common.errors import AdapterBug, InvalidInput, Unsupported
from stateset_backend.contracts.loader import Deviation, Dialect
from stateset_backend.spec.model import (
    NON_IDENTITY_FIELDS,
    RL_ONLY_ALGORITHM_KEYS,
    SUPERVISED,
    ExperimentSpec,
)
from stateset_backend.spec.modeltree import leaves


# -- what a rule answers -------------------------------------------------------------------
@dataclass(frozen=True)
class Pinned:
    """The launch sets ``native`` so the engine does what the spec says. ``how`` says how it
    is carried when no native key does (a generated file, the hub's own file check)."""

    native: dict[str, Any]
    how: str = ""
    hub: bool = False  # the hub's own code holds it (a generated shim or launcher, a check)


@dataclass(frozen=True)
class Hardcoded:
    """The engine's code fixes this setting at ``engine_value`` whatever the launch says.

    The kit turns it into *pinned* when the spec asks for exactly that value, *declared* when
    the dialect declares ``deviation``, and *refused* otherwise. ``native`` is still set (for
    instance the switch that turns the feature on)."""

    engine_value: Any
    deviation: str
    native: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class NotApplicable:
    """Only for leaves that are not part of the experiment (``name``, ``resources``)."""

    reason: str


Outcome = Pinned | Hardcoded | Refused | NotApplicable
Rule = Callable[[Any, ExperimentSpec], Outcome]
RuleSet = Mapping[str, Rule]
State = Literal["pinned", "declared", "refused", "inert", "not_applicable"]


# -- rule builders -------------------------------------------------------------------------
def to(*keys: str, convert: Callable[[Any], Any] | None = None) -> Rule:
    """Pin a leaf onto one or more native keys (the same value under each)."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native_value = convert(value) if convert is not None else value
        return Pinned({k: native_value for k in keys})

    return rule


def carried(how: str, *, hub: bool = False) -> Rule:
    """The launch honours the leaf without a native key: the engine's own behaviour already
    is the spec's, or (``hub``) the hub's generated shim, launcher or file check makes it so,
    which `explain --effective` shows as pinned rather than the same."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({}, how, hub)

    return rule


def hardcoded(engine_value: Any, deviation: str) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Hardcoded(engine_value, deviation)

    return rule


def na(reason: str) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return NotApplicable(reason)

    return rule


def refuse(reason: str) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Refused(reason)

    return rule


def only(allowed: Callable[[Any], bool], reason: str, then: Rule) -> Rule:
    """Apply ``then`` when the value is one the engine can honour, else refuse with reason."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return then(value, spec) if allowed(value) else Refused(reason)

    return rule


def when_set(then: Rule, unset: Rule) -> Rule:
    """Dispatch on whether an optional section is present (null means 'off')."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return unset(value, spec) if value is None else then(value, spec)

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


# -- leaves the core decides for every engine alike ----------------------------------------
# Not part of the experiment and never passed to an engine.
CORE_HANDLED: dict[str, str] = {
    "version": "the spec version the document was written for",
    "labels": "recorded in the run store, not passed to the engine",
    "equivalence": "decides whether declared deviations may run",
    "engine_options": "merged as raw native keys after the pinned settings",
}


# Leaves added to the spec after plugins were written against it, each inert at its default:
# an adapter with no rule for one refuses a spec that sets it, rather than failing. A section
# stands for every leaf below it.
NEWER_LEAVES: dict[str, str] = {
    "data.max_total_tokens": "a budget a prompt and its response share",
    "algorithm.rollout_correction": "importance weights for the sampler/learner mismatch",
    "optim.warmup_start_ratio": "where warmup starts, as a fraction of lr",
}


def newer_leaf(path: str) -> str | None:
    """The NEWER_LEAVES entry that covers a leaf (itself or a section above it), if any."""
    return next((p for p in NEWER_LEAVES if path == p or path.startswith(p + ".")), None)


def inert_reason(spec: ExperimentSpec, path: str) -> str | None:
    """Why a leaf cannot change this experiment on any engine, or None when it can."""
    supervised = spec.algorithm.objective == SUPERVISED
    if supervised and (path.startswith("rollout.") or any(
            path == f"algorithm.{key}" or path.startswith(f"algorithm.{key}.")
            for key in RL_ONLY_ALGORITHM_KEYS)):
        return "sft learns from the data's answers: nothing is sampled during training"
    if supervised and path in ("budget.ppo_epochs", "budget.mini_batches"):
        return "sft makes one optimizer step per update"
    if path == "algorithm.sft" and not supervised:
        return "only sft lays out answer rows"
    if path.startswith("data.test.") or path == "data.test":
        return "the test split is never read during training"
    if path in ("evaluation.temperature", "evaluation.top_p", "evaluation.samples") and \
            spec.evaluation.every is None:
        return "no validation runs during training (evaluation.every is null)"
    if path in ("algorithm.advantage.std", "algorithm.advantage.epsilon") and \
            not spec.algorithm.advantage.std_normalize:
        return "advantages are not divided by a std (std_normalize is false)"
    if path == "data.max_total_tokens" and spec.data.max_total_tokens is None:
        return "no shared budget: a response is limited by data.max_response_tokens alone"
    if path == "optim.warmup_start_ratio" and spec.optim.warmup_start_ratio is None:
        return "warmup starts from 0 (or there is none)"
    if path == "evaluation.select_by" and spec.evaluation.select_by is None:
        return "no checkpoint is selected by a metric"
    if path.startswith("environment.") and path not in ("environment.kind",
                                                        "environment.max_turns") and \
            spec.environment.kind == "single_turn":
        return "single-turn: the reward function is the environment"
    if path in ("reward.entrypoint", "reward.sha256") and spec.reward.kind == "environment":
        return "the environment gives the rewards"
    if path == "environment.turn_discount" and spec.environment.reward_placement == "final":
        return "only the final reward counts (reward_placement final)"
    return None


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
    """One leaf on one engine release: its state, what the engine will really do, and why."""

    path: str
    value: Any
    state: State
    effective: Any = None
    native: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    deviation: Deviation | None = None
    deviation_name: str | None = None
    hub_enforced: bool = False  # the hub's shim, launcher or check holds it, no engine key

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"field": self.path, "value": self.value, "state": self.state,
                               "effective": self.effective}
        if self.native:
            doc["native"] = self.native
        if self.reason:
            doc["reason"] = self.reason
        if self.deviation_name is not None:
            doc["deviation"] = self.deviation_name
        return doc


def identity_leaf(path: str) -> bool:
    """Whether a spec path (or a native key's source) is a setting of the experiment's
    identity."""
    return path.split(".", 1)[0] not in NON_IDENTITY_FIELDS


def explain_rows(spec: ExperimentSpec, rules: RuleSet, dialect: Dialect,
                 engine: str = "the engine") -> list[FieldRow]:
    """Every leaf of the spec resolved to its state on one engine release."""
    if not isinstance(rules, Mapping):  # else each leaf would be "no rule for" it
        raise AdapterBug(f"the {engine} adapter's rules() returned a "
                         f"{type(rules).__name__}, not a mapping of spec paths to rules")
    rows: list[FieldRow] = []
    for path, value in leaves(spec):
        if path in CORE_HANDLED:
            rows.append(FieldRow(path, value, "not_applicable", reason=CORE_HANDLED[path]))
            continue
        inert = inert_reason(spec, path)
        if inert is not None:
            rows.append(FieldRow(path, value, "inert", reason=inert))
            continue
        rule = rule_for(rules, path)
        newer = newer_leaf(path) if rule is None else None
        if newer is not None and value is None:  # an unset section: nothing to translate
            rows.append(FieldRow(path, value, "inert", reason=f"{newer} is not set"))
            continue
        if newer is not None:
            rows.append(FieldRow(path, value, "refused", reason=(
                f"the {engine} adapter predates {newer} ({NEWER_LEAVES[newer]}) and says "
                "nothing of it")))
            continue
        if rule is None:
            raise AdapterBug(f"the {engine} adapter has no rule for {path}")
        rows.append(_resolve(path, value, rule(value, spec), spec, dialect, engine))
    return _one_key_two_leaves(rows, engine)


def _one_key_two_leaves(rows: list[FieldRow], engine: str) -> list[FieldRow]:
    """An engine that reads one key for two spec leaves (verl's single ``data.prompt_key`` for
    every split) cannot honour them when they differ: the later leaf is refused, naming both.
    Only leaves copied verbatim onto the key count; two rules that derive different values for
    one key are an adapter bug, which translation reports."""
    setters: dict[str, FieldRow] = {}
    out: list[FieldRow] = []
    for row in rows:
        clash = next((key for key, v in row.native.items() if key in setters
                      and _same(v, row.value) and _same(setters[key].native[key],
                                                        setters[key].value)
                      and not _same(v, setters[key].native[key])), None)
        if clash is not None:
            first = setters[clash]
            out.append(FieldRow(row.path, row.value, "refused", reason=(
                f"{engine} reads one key, {clash}, for both {first.path} and {row.path}; "
                f"they differ ({_quoted(first.value)} and {_quoted(row.value)}): set them equal")))
            continue
        for key in row.native:
            setters.setdefault(key, row)
        out.append(row)
    return out


def _resolve(path: str, value: Any, outcome: Outcome, spec: ExperimentSpec, dialect: Dialect,
             engine: str) -> FieldRow:
    if isinstance(outcome, Pinned):
        if not outcome.native and not outcome.how:
            raise AdapterBug(f"the {engine} adapter pins {path} with no native key and no "
                             "stated carrier: say how the launch honours it")
        return FieldRow(path, value, "pinned", value, dict(outcome.native), outcome.how,
                        hub_enforced=outcome.hub)
    if isinstance(outcome, Refused):
        return FieldRow(path, value, "refused", reason=outcome.reason)
    if isinstance(outcome, NotApplicable):
        if identity_leaf(path):
            raise AdapterBug(f"the {engine} adapter calls {path} not applicable, but it is part "
                             "of the experiment: pin it, refuse it, or declare a deviation")
        return FieldRow(path, value, "not_applicable", reason=outcome.reason)
    if _same(value, outcome.engine_value):
        return FieldRow(path, value, "pinned", value, dict(outcome.native),
                        f"hard-coded by {engine} to this value")
    declared = dialect.deviations.get(outcome.deviation)
    if declared is None or declared.setting != path:
        return FieldRow(path, value, "refused", reason=(
            f"{engine} {dialect.name} always uses {_show(outcome.engine_value)}; the spec asks "
            f"for {_show(value)}"))
    if spec.equivalence == "strict":
        return FieldRow(path, value, "refused", reason=(
            f"declared deviation {outcome.deviation!r} ({declared.description}) is refused "
            "under equivalence: strict"))
    return FieldRow(path, value, "declared", declared.engine_value, dict(outcome.native),
                    declared.description, declared, outcome.deviation)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _quoted(value: Any) -> str:
    """A user's value inside a message: quoted, so the message stays one line."""
    import json

    return json.dumps(value, ensure_ascii=False)


def _show(value: Any) -> str:
    import json

    return json.dumps(value) if not isinstance(value, str) else value


@dataclass(frozen=True)
class Translation:
    native: dict[str, Any]
    sources: dict[str, str]  # native key -> spec path (or engine_options)
    rows: tuple[FieldRow, ...] = ()

    @property
    def deviations(self) -> list[dict[str, Any]]:
        """The declared deviations this launch runs with, as the plan and result record them."""
        return [{"setting": r.path, "deviation": r.deviation_name, "spec_value": r.value,
                 "engine_value": r.effective, "description": r.reason}
                for r in self.rows if r.state == "declared"]


def translate(spec: ExperimentSpec, rules: RuleSet, dialect: Dialect, engine: str,
              version: str) -> Translation:
    """Resolve every leaf; refuse on any refusal or an engine_options entry that reaches a
    key a rule pins (other than a declared execution default that no setting of the
    experiment sets: a key the translation takes from the spec's math is that setting's,
    whatever the dialect declares, and an option over it would change the experiment outside
    its identity)."""
    from stateset_backend.translate.execution import (
        declared_inside,
        execution_defaults,
        merged,
        reached,
    )

    native: dict[str, Any] = {}
    sources: dict[str, str] = {}
    refused: list[str] = []
    rows = explain_rows(spec, rules, dialect, engine)
    for row in rows:
        if row.state == "refused":
            refused.append(f"{row.path}: {row.reason}")
        for key, value in row.native.items():
            if key in native and native[key] != value:
                raise AdapterBug(f"the {engine} adapter sets {key} from {sources[key]} and "
                                 f"{row.path} to different values")
            native[key] = value
            sources[key] = row.path
    if refused:
        raise Unsupported(f"{engine} {version} cannot honour: " + problems_text(refused),
                          details={"refused": refused})
    from_spec = {_bare(key) for key, path in sources.items() if identity_leaf(path)}
    execution = {key: declared for key, declared in execution_defaults(dialect).items()
                 if key not in from_spec}
    for key, value in spec.engine_options.get(engine, {}).items():
        try:
            taken = reached(key, value, native, execution, option_conflict)
        except InvalidInput as exc:
            raise InvalidInput(f"engine_options.{engine}.{exc.message}") from None
        inside = declared_inside(taken, execution) if taken is not None else []
        if inside:  # a mapping held but for its declared keys: a spec setting changes none
            raise InvalidInput(f"engine_options.{engine}.{key}: reaches {taken}, which the "
                               f"launch holds; only {', '.join(inside)} may be given inside "
                               "it, at the values that leave the math unchanged")
        fixed = dialect.keys.get("fixed") or ()
        if taken is not None and _bare(taken) in fixed:  # the same for every spec
            raise InvalidInput(f"engine_options.{engine}.{key}: reaches {taken}, which the "
                               f"launch holds at {native[taken]!r} for every spec: it changes "
                               "the math, the model or its inputs, and no spec setting "
                               "names it")
        if taken is not None:
            raise InvalidInput(f"engine_options.{engine}.{key}: overrides the key that "
                               f"{sources[taken]} pins ({taken}); change {sources[taken]} "
                               "instead")
        native[key] = merged(native.get(key), value)
        sources[key] = f"engine_options.{engine}"
    return Translation(native, sources, tuple(rows))


def _bare(key: str) -> str:
    """A native key without Hydra's edit prefixes (``~`` delete, ``+`` add, ``++`` force) or an
    ``=value`` suffix: every spelling that reaches the same key."""
    return key.lstrip("~+").split("=", 1)[0]


def option_conflict(key: str, taken: Any) -> str | None:
    """The key in ``taken`` that an ``engine_options`` entry would delete, add over, override
    or shadow, in any spelling, or None.

    Hydra keys conflict when equal or when one is a dotted parent of the other (a mapping at
    ``actor`` replaces ``actor.clip_ratio``). Flags conflict when equal or when the option is
    a prefix of a taken flag, because argparse accepts any unambiguous abbreviation."""
    bare = _bare(key)
    for other in taken:
        theirs = _bare(other)
        if bare.startswith("-") or theirs.startswith("-"):
            if bare and theirs.startswith(bare):
                return str(other)
        elif bare == theirs or theirs.startswith(bare + ".") or bare.startswith(theirs + "."):
            return str(other)
    return None
