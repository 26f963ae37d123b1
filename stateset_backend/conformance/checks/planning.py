"""Planning the kit's samples on an adapter, and what planning alone proves.

Every other check starts here: :class:`CheckFailed`, a sample planned through the adapter
(``plan_doc``), the base sample fitted to what the release hard-codes (``fitted_base``,
``base_plan``) and the gaps an adapter or its test class declares. The checks: a claimed
capability has a sample that plans with nothing silently dropped; an unclaimed one is refused
with exit 3 before anything could launch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from stateset_backend.common.errors import AdapterBug, InvalidInput, Unsupported
from stateset_backend.common.jsonio import put
from stateset_backend.conformance import memo
from stateset_backend.conformance.samples import (
    Sample,
    SampleFiles,
    base_doc,
    deep_merge,
    samples_for,
)
from stateset_backend.contracts.loader import Contract, parse_version
from stateset_backend.engines.adapter import EngineAdapter, unpinned_defaults
from stateset_backend.engines.registry import entry_of
from stateset_backend.plan.launch_plan import LaunchPlan, make_plan
from stateset_backend.spec.files import parse_spec
from stateset_backend.translate.rules import explain_rows


class CheckFailed(AssertionError):
    """The adapter does not conform; the message says where and why."""


# -- declared gaps ---------------------------------------------------------------------------------
def reasons_of(entries: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    """Declared gaps as {entry: reason}: a plain list of entries gives each no reason."""
    return dict(entries) if isinstance(entries, Mapping) else dict.fromkeys(entries, "")


def declared_unsupported(unsupported: Iterable[str] | Mapping[str, str], capability: str,
                         version: str) -> str | None:
    """The reason a capability is declared unsupported at ``version``, or None. Entries are
    capability names, optionally followed by a PEP 440 specifier that limits them
    (``"objective:gspo <0.11.2"``); a mapping gives each entry its reason."""
    for entry, reason in reasons_of(unsupported).items():
        name, _, where = entry.partition(" ")
        if name != capability:
            continue
        try:
            if where.strip() and not SpecifierSet(where.strip()).contains(
                    Version(version), prereleases=True):
                continue
        except InvalidSpecifier:
            raise CheckFailed(f"unsupported entry {entry!r}: {where!r} is not a PEP 440 "
                              "specifier") from None
        return reason or "declared unsupported by the adapter"
    return None


# -- planning samples ------------------------------------------------------------------------------
def plan_doc(adapter: EngineAdapter, version: str, doc: dict[str, Any],
             files: SampleFiles) -> LaunchPlan:
    """The document planned through the adapter. A plan is a function of the validated spec,
    so a spec that plans is planned once per sample files, however many checks and documents
    ask for it (a refusal is asked again: it is cheap, and checks read its details)."""
    spec = parse_spec(doc)
    key = ("plan", memo.adapter_key(adapter), version, repr(spec.model_dump(mode="json")))
    return memo.once(files, key, lambda: make_plan(spec, entry_of(adapter), version,
                                                   base_dir=files.root))


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def plan_or_none(adapter: EngineAdapter, version: str, doc: dict[str, Any],
                 files: SampleFiles) -> LaunchPlan | None:
    """The plan, or None where the release refuses the document (exit 2 or 3). An adapter
    that raises is failed, not taken for a refusal: the planner reports any exception from
    an adapter as an ``AdapterBug`` (exit 1 for a user), which is an ``Unsupported``."""
    try:
        return plan_doc(adapter, version, doc, files)
    except AdapterBug as exc:
        raise CheckFailed(describe(exc)) from None
    except (InvalidInput, Unsupported):
        return None


def plannable_sample(adapter: EngineAdapter, version: str, capability: str, files: SampleFiles,
                     overrides: dict[str, Any] | None = None) -> tuple[Sample, LaunchPlan]:
    """The first sample needing a claimed ``capability`` that plans, or CheckFailed naming why
    each sample was refused. Planned once per sample files: the capability check and every
    check that starts from the claimed samples share it."""
    key = ("sample", memo.adapter_key(adapter), version, capability, repr(overrides))
    sample, plan = memo.once(files, key, lambda: _plannable_sample(
        adapter, version, capability, files, overrides), remembered=(CheckFailed,))
    return replace(sample, doc=copy.deepcopy(sample.doc)), plan


def _plannable_sample(adapter: EngineAdapter, version: str, capability: str,
                      files: SampleFiles,
                      overrides: dict[str, Any] | None) -> tuple[Sample, LaunchPlan]:
    samples = samples_for(adapter.contract, version, capability, files, overrides,
                          fitted_base(adapter, version, files, overrides))
    if not samples:
        raise CheckFailed(f"{capability}: no sample needing it can be built from what "
                          f"{adapter.name} {version} claims")
    errors = []
    for sample in samples:
        try:
            return sample, plan_doc(adapter, version, sample.doc, files)
        except Exception as exc:
            if isinstance(exc, AdapterBug) or not isinstance(exc, InvalidInput | Unsupported):
                # a spec the adapter crashes on is a user's exit 1, whatever a later sample
                # plans: a refusal deleted leaves the rule to fail on what it refused
                raise CheckFailed(f"{capability}: a sample needing it makes the adapter fail "
                                  f"({describe(exc)}); refuse what the engine cannot honour "
                                  "(exit 2 or 3)") from None
            errors.append(describe(exc))
    raise CheckFailed(f"{adapter.name} {version} claims {capability}, but no sample needing it "
                      f"plans: " + " | ".join(dict.fromkeys(errors)))


def check_no_silent_drop(adapter: EngineAdapter, version: str, plan: LaunchPlan) -> None:
    """Every leaf is pinned, refused or declared with a stated native key or reason, and every
    default the dialect records is set by the launch."""
    dialect = adapter.contract.dialect(parse_version(version))
    spec = plan.validated_spec()
    for row in explain_rows(spec, adapter.rules(dialect), dialect, adapter.name):
        if row.state in ("refused", "declared", "inert", "not_applicable") and \
                not row.reason.strip():
            raise CheckFailed(f"{row.path}: {row.state} with no reason")
        if row.state == "pinned" and not row.native and not row.reason.strip():
            raise CheckFailed(f"{row.path}: pinned onto no native key and no stated carrier")
    missing = unpinned_defaults(dialect, plan.native, plan.unread_defaults)
    if missing:
        raise CheckFailed(f"the launch leaves {', '.join(missing)} at the release default")


def check_capability(adapter: EngineAdapter, version: str, capability: str,
                     files: SampleFiles, overrides: dict[str, Any] | None = None) -> str:
    """A claimed capability plans with nothing dropped; an unclaimed one is refused with exit 3
    (Unsupported, naming it) before anything could launch. Returns what was proved."""
    claimed = capability in adapter.contract.provided(parse_version(version))
    if claimed:
        sample, plan = plannable_sample(adapter, version, capability, files, overrides)
        check_no_silent_drop(adapter, version, plan)
        return f"claimed; a sample needing it plans ({len(plan.argv)} argv elements)"
    samples = samples_for(adapter.contract, version, capability, files, overrides,
                          fitted_base(adapter, version, files, overrides))
    if not samples:
        raise CheckFailed(f"{capability}: no sample needing it can be built")
    for sample in samples:
        try:
            plan_doc(adapter, version, sample.doc, files)
        except AdapterBug as exc:
            raise CheckFailed(f"not claimed, but refused as an adapter bug: {exc}") from None
        except Unsupported as exc:
            missing = {m.get("capability") for m in (exc.details or {}).get("missing", [])} \
                if isinstance(exc.details, dict) else set()
            if capability not in missing:
                raise CheckFailed(f"not claimed; refused, but the refusal does not name it: "
                                  f"{exc}") from None
            if exc.exit_code != 3:
                raise CheckFailed(f"not claimed; refused with exit {exc.exit_code}, not 3") \
                    from None
            continue
        except Exception as exc:
            raise CheckFailed(f"not claimed; expected exit 3 (unsupported), got "
                              f"{describe(exc)}") from None
        raise CheckFailed(f"not claimed by {adapter.name} {version}, yet a spec needing it "
                          "planned")
    return "not claimed; refused with exit 3 before launch"


def claimed_plans(adapter: EngineAdapter, version: str, files: SampleFiles,
                  overrides: dict[str, Any] | None,
                  skip: Callable[[str], bool]) -> list[tuple[Sample, LaunchPlan]]:
    """One plannable sample per claimed capability (those ``skip`` says are not declared gaps);
    capabilities with no plannable sample are left to the capability check. When none plans,
    the failure is one, with the reasons the samples were refused."""
    from stateset_backend.conformance.samples import SAMPLED

    out, errors = [], []
    provided = adapter.contract.provided(parse_version(version))
    for capability in SAMPLED:
        if capability not in provided or skip(capability):
            continue
        try:
            out.append(plannable_sample(adapter, version, capability, files, overrides))
        except CheckFailed as exc:
            errors.append(str(exc).split(": ", 1)[-1])
    if not out and errors:
        raise CheckFailed(f"no claimed capability of {adapter.name} {version} plans; the "
                          f"samples are refused with: {' | '.join(dict.fromkeys(errors))[:1500]}")
    return out


def awkward_plans(adapter: EngineAdapter, version: str, files: SampleFiles,
                  overrides: dict[str, Any] | None) -> list[tuple[str, LaunchPlan]]:
    """The fitted base at each of the kit's awkward numbers (``specs.AWKWARD``) that plans, by
    name. One the release refuses (exit 2 or 3: a capability it does not claim, a batch it
    cannot split) is left out; an adapter that raises fails."""
    from stateset_backend.conformance.specs import AWKWARD

    base, out = fitted_base(adapter, version, files, overrides), []
    for name, numbers in AWKWARD.items():
        if "evaluation" in numbers:
            numbers = deep_merge(numbers, {"data": {"validation": files.split("validation")}})
        try:
            plan = plan_or_none(adapter, version, deep_merge(base, numbers), files)
        except CheckFailed as exc:
            raise CheckFailed(f"{name}: {exc}") from None
        if plan is not None:
            out.append((name, plan))
    return out


# -- the base sample -------------------------------------------------------------------------------
def fitted_base(adapter: EngineAdapter, version: str, files: SampleFiles,
                overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The base, with every setting the release hard-codes (and refuses otherwise) moved to
    the release's value, so the base plans without per-engine hand-written specs. Fitted once
    per sample files: every sample starts from it."""
    key = ("fitted base", memo.adapter_key(adapter), version, repr(overrides))
    return copy.deepcopy(memo.once(files, key, lambda: _fitted_base(adapter, version, files,
                                                                    overrides)))


def _fitted_base(adapter: EngineAdapter, version: str, files: SampleFiles,
                 overrides: dict[str, Any] | None) -> dict[str, Any]:
    from stateset_backend.translate.rules import Hardcoded, rule_for

    doc = base_doc(adapter.contract, version, files, overrides)
    dialect = adapter.contract.dialect(parse_version(version))
    try:
        spec = parse_spec(doc)
        rows = explain_rows(spec, adapter.rules(dialect), dialect, adapter.name)
    except Exception:
        return doc
    for row in rows:
        if row.state != "refused" or (overrides and _has(overrides, row.path)):
            continue
        rule = rule_for(adapter.rules(dialect), row.path)
        outcome = rule(row.value, spec) if rule is not None else None
        if isinstance(outcome, Hardcoded):
            candidate = deep_merge(doc, _nested(row.path, outcome.engine_value))
            try:
                parse_spec(candidate)
            except Exception:
                continue
            doc = candidate
    return doc


def range_edges(contract: Contract, listed: Iterable[str]) -> list[str]:
    """Releases the contract admits that a list of checked ones may leave out: every bound
    its ranges name, and, where the supported range is open above, a minor and a major
    release past the newest of those and the list (an adapter that looks its keys up in a
    table of the releases its author tried plans there, or raises)."""
    listed = set(listed)
    named = contract.named_versions()
    newest = max([*named, *(parse_version(v) for v in listed)], default=None)
    later = [] if newest is None else [parse_version(f"{newest.major}.{newest.minor + 1}.0"),
                                       parse_version(f"{newest.major + 1}.0.0")]
    open_above = contract.supports(parse_version("99999"))
    edges = [*named, *(later if open_above else [])]
    return [str(v) for v in sorted(set(edges)) if str(v) not in listed and contract.supports(v)]


def check_range_edges(adapter: EngineAdapter, listed: Iterable[str], files: SampleFiles,
                      overrides: dict[str, Any] | None) -> list[str]:
    """The base sample plans, or is refused with exit 2 or 3, at each of ``range_edges``:
    a release the contract claims is one a user may have installed, and an adapter that
    raises there fails every plan of theirs with an internal error. Returns the releases
    tried."""
    edges = range_edges(adapter.contract, listed)
    for version in edges:
        try:
            plan_doc(adapter, version, fitted_base(adapter, version, files, overrides), files)
        except Exception as exc:  # an AdapterBug is an Unsupported the planner wrapped
            if isinstance(exc, InvalidInput | Unsupported) and not isinstance(exc, AdapterBug):
                continue
            raise CheckFailed(f"{adapter.name} {version}, which the contract's supported range "
                              f"{adapter.contract.supported!r} admits: planning the base "
                              f"sample raised {describe(exc)}; every release the range admits "
                              "must plan a spec or refuse it (exit 2 or 3)") from None
    return edges


def _nested(path: str, value: Any) -> dict[str, Any]:
    return put({}, path, value)


def _has(doc: dict[str, Any], path: str) -> bool:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def base_plan(adapter: EngineAdapter, version: str, files: SampleFiles,
              overrides: dict[str, Any] | None, **extra: Any) -> tuple[dict[str, Any],
                                                                       LaunchPlan]:
    """The fitted base with ``extra`` merged in, planned; once per sample files, as most
    checks start from it."""
    key = ("base", memo.adapter_key(adapter), version, repr(overrides), repr(extra))
    doc, plan = memo.once(files, key, lambda: _base_plan(adapter, version, files, overrides,
                                                         extra), remembered=(CheckFailed,))
    return copy.deepcopy(doc), plan


def _base_plan(adapter: EngineAdapter, version: str, files: SampleFiles,
               overrides: dict[str, Any] | None,
               extra: dict[str, Any]) -> tuple[dict[str, Any], LaunchPlan]:
    doc = deep_merge(fitted_base(adapter, version, files, overrides), extra)
    try:
        return doc, plan_doc(adapter, version, doc, files)
    except Exception as exc:
        raise CheckFailed(f"the base sample does not plan on {adapter.name} {version}: "
                          f"{describe(exc)}") from None
