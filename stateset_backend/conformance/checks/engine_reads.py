"""The launch as the engine reads it (the kit's own reader for a built-in engine, a plugin's
``parse_launch``), held to the launch, the release and the spec.

The engine reads what the launch declares, key for key, every key exists in the release's
surface and every default the contract records is the release's own; it reads the values the
kit knows, from the engine itself, it must read for the spec (``expectations``). Each numeric
setting reaches exactly the keys its rule claims; settings of different math launch
differently; every deviation the dialect declares is run by some sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.checks.planning import CheckFailed, plan_doc, plan_or_none
from stateset_backend.conformance.checks.variants import nullable, variants
from stateset_backend.conformance.reach import leaf, reach_deviations, with_leaf
from stateset_backend.conformance.samples import SampleFiles
from stateset_backend.contracts import domains
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.translate.rules import explain_rows, identity_leaf


# -- what the engine reads, against what the launch claims and what the release has ------------
def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, float) and not math.isfinite(b):
        return a == ("nan" if b != b else "inf" if b > 0 else "-inf")
    if isinstance(b, str) and isinstance(a, float):
        return same_value(b, a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def normalize_values(node: Any, plan: LaunchPlan) -> Any:
    """Parsed values with the plan's own run id and digest replaced, so two plans compare."""
    digest = plan.experiment_digest.removeprefix("sha256:")
    if isinstance(node, str):
        return node.replace(plan.run_id, "<run-id>").replace(digest, "<digest>")
    if isinstance(node, list):
        return [normalize_values(v, plan) for v in node]
    if isinstance(node, dict):
        return {k: normalize_values(v, plan) for k, v in node.items()}
    return node


def _same_files(a: LaunchPlan, b: LaunchPlan) -> bool:
    """The two launches write the same files, each plan's own run id and digest aside: a
    launch that names its run in a file (as a launch should) differs from every other plan's
    in that name alone, which says nothing of whether a setting reached the engine."""
    def named(plan: LaunchPlan) -> Any:
        return normalize_values([[k, v] for k, v in sorted(plan.files.items())], plan)

    return named(a) == named(b)


def _flat_native(plan: LaunchPlan) -> tuple[dict[str, Any], set[str]]:
    """The launch's declared native keys, dotted, without Hydra's ``+``; and the keys it
    adds with ``+`` (not in the release's base config: read with ``.get()``)."""
    out: dict[str, Any] = {}
    added: set[str] = set()
    for key, value in plan.native.items():
        bare = key.lstrip("+")
        flat = flatten(value, bare) if isinstance(value, dict) and value else {bare: value}
        out.update(flat)
        if key.startswith("+"):
            added.update(flat)
    return out, added


def _closest(key: str, known: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_reads_as_declared(adapter: EngineAdapter, plan: LaunchPlan, read: dict[str, Any],
                            surface: dict[str, Any] | None,
                            also_read: Callable[[str], bool] = lambda key: False) -> None:
    """What the engine reads from the launch is what the launch declares, key for key; every
    key it reads exists in the release's surface; every default the contract records is the
    release's own."""
    engine, version = adapter.name, plan.engine_version
    where = f"{engine} {version}"
    declared, added = _flat_native(plan)
    options: dict[str, Any] = surface["options"] if surface is not None else {}
    for key, value in declared.items():
        if key not in read:
            default = options.get(key, {}).get("default", object())
            if (value is False or value is None) and (not options or
                                                      same_value(default, value)):
                continue  # an omitted switch or value: the release's default is the value
            raise CheckFailed(f"{key}: the launch lists it as set to {value!r}, but {where} "
                              "reads nothing for it from the launch (dropped from the argv, "
                              "or set under another spelling); put it in the launch")
        if not same_value(read[key], value):
            raise CheckFailed(f"{key}: {where} reads {read[key]!r} from the launch, which "
                              f"declares {value!r}; render what the translation says")
    for key in read:
        if key not in declared and not also_read(key):
            raise CheckFailed(f"{key}: {where} reads it from the launch, but the launch does "
                              "not list it among its native keys; declare every key it sets")
    if surface is None:
        return
    def in_surface(key: str) -> bool:
        """The key, or a mapping above it the release reads whole (a default of null or
        {}: the engine takes whatever mapping the launch gives, e.g. an optimizer's extra
        keyword arguments)."""
        parts = key.split(".")
        return key in options or any(
            options.get(".".join(parts[:i]), {}).get("default", 0) in (None, {})
            for i in range(1, len(parts)))

    for key in read:
        if not in_surface(key) and key not in added:
            raise CheckFailed(f"{key}: {where} has no such key, so the setting is ignored or "
                              f"refused (a typo, or another release's spelling?)"
                              f"{_closest(key, options)}")
    for key, value in read.items():
        outside = domains.violation(key, value, options.get(key, {}), where)
        if outside is not None:
            raise CheckFailed(outside)
    dialect = plan.resolved_dialect()
    for key, recorded in dialect.defaults.items():
        bare = key.lstrip("+")
        if bare not in options:
            if key.startswith("+") or bare in added:
                continue  # read with .get(): not in the release's config to compare
            raise CheckFailed(f"the {dialect.name} dialect records a default for {bare}, which "
                              f"{where} does not have{_closest(bare, options)}")
        real = options[bare]
        if not (same_value(real.get("default"), recorded) or
                same_value(real.get("written"), recorded)):
            raise CheckFailed(f"the {dialect.name} dialect records {bare} = {recorded!r}, but "
                              f"{where}'s default is {real.get('default')!r}; record the "
                              "release's own default")


# -- sensitivity: a setting reaches exactly the keys its rule claims -----------------------------
# settings the sample's other settings make moot (``_moot``), and what makes them count: such
# a leaf is varied with those set, or no sample ever checks it (a cosine floor under the
# base's constant schedule, a validation top-p under greedy decoding)
ENABLED_BY: dict[str, dict[str, Any]] = {
    "optim.min_lr_ratio": {"optim.schedule": "cosine"},
    "evaluation.top_p": {"evaluation.temperature": 0.7}}


def translated_keys(adapter: EngineAdapter, plan: LaunchPlan,
                    path: str | None = None, *, identity: bool = False) -> set[str]:
    """The native keys the plan's translation says the spec's settings set (``path``: that
    one's alone; ``identity``: the experiment's settings only, not its resources or name),
    dotted, without Hydra's '+'."""
    dialect = plan.resolved_dialect()
    rows = explain_rows(plan.validated_spec(), adapter.rules(dialect), dialect, adapter.name)
    out: set[str] = set()
    for row in rows:
        if (path is None or row.path == path) and (not identity or identity_leaf(row.path)):
            for key, value in row.native.items():
                bare = key.lstrip("+")
                out |= set(flatten(value, bare)) if isinstance(value, dict) and value \
                    else {bare}
    return out


def _moot(path: str, spec: Any) -> bool:
    """Settings the spec's own meaning makes moot in this sample, whatever the engine (the
    kit's knowledge of the spec, not of any adapter): a launch may pin them at anything."""
    return (path == "optim.min_lr_ratio" and spec.optim.schedule == "constant") or \
        (path == "evaluation.top_p" and spec.evaluation.temperature == 0)  # greedy


# Leaves whose other values may launch alike: an objective names a recipe of other settings
# (with those held, objectives of one class are one experiment; the distinct-launch check holds
# the classes apart); a conversation's kind says whether its environment class declares tools,
# which the shims read from the class itself (the capability check holds the kinds apart)
HELD_APART = frozenset({"algorithm.objective", "environment.kind"})


def own_leaves(leaves: dict[str, Any], at_base: dict[str, Any]) -> set[str]:
    """The leaves a capability's sample sets apart from the base sample (``leaves`` and
    ``at_base`` flattened): the settings varied in that sample, and with validation on,
    validation's decoding, which counts only there."""
    own = {k for k, v in leaves.items() if k not in at_base or at_base[k] != v}
    if "evaluation.every" in own:
        own |= {k for k in leaves if k.startswith("evaluation.")}
    return own


def check_sensitivity(adapter: EngineAdapter, version: str, base: dict[str, Any],
                      files: SampleFiles, read: Callable[[LaunchPlan], dict[str, Any]],
                      also_read: Callable[[str], bool] = lambda key: False,
                      surface: dict[str, Any] | None = None,
                      only: Callable[[str], bool] | None = None) -> int:
    """For every leaf the translation pins onto engine keys (``only`` those it accepts): the
    sample planned at other values of the leaf's kind (two more numbers, the other boolean,
    the enum's other members; with only one that plans, against the sample itself) and read
    back as the engine reads it. Every key the translation claims is in the rendered launch;
    at least one claimed key must read differently, or a file the launch writes must differ
    (the setting reaches the engine; the hub's shims read theirs from files), and every
    key that reads differently must be one the launch changed (no setting leaks into keys it
    does not claim). Returns how many leaves were varied."""
    dialect = adapter.contract.dialect(parse_version(version))
    origin = plan_doc(adapter, version, base, files)
    spec = origin.validated_spec()
    rows = explain_rows(spec, adapter.rules(dialect), dialect, adapter.name)
    full = spec.model_dump(mode="json")
    varied = 0
    for row in rows:
        if row.state != "pinned" or row.path.split(".")[0] in (
                "resources", "seed", "engine_options") or (only and not only(row.path)) or \
                row.path in HELD_APART or (row.hub_enforced and not row.native):
            continue
        if not row.native:
            varied += _check_carried_rule(adapter, version, origin, full, files, read, row,
                                          spec)
            continue
        _carried(origin, row.path, row.native)
        context = full
        baseline: LaunchPlan | None = origin
        if _moot(row.path, spec) and row.path in ENABLED_BY:
            for path, value in ENABLED_BY[row.path].items():
                context = with_leaf(context, path, value)
            baseline = plan_or_none(adapter, version, context, files)
        plans = []
        for value in variants(row.value, row.path):
            plan = plan_or_none(adapter, version, with_leaf(context, row.path, value), files)
            if plan is not None:
                plans.append((value, plan))
            if len(plans) == 2:
                break
        if not plans or (len(plans) == 1 and baseline is None):
            continue
        if len(plans) == 1:
            assert baseline is not None
            plans.insert(0, (row.value, baseline))
        (a_value, a), (b_value, b) = plans
        read_a = flatten(normalize_values(read(a), a))
        read_b = flatten(normalize_values(read(b), b))
        checked = [(a, read_a), (b, read_b)]
        if row.value is not None and nullable(row.path):
            # null ("off") as well: the sample sets the leaf, so no other sample unsets it
            off = plan_or_none(adapter, version, with_leaf(context, row.path, None), files)
            if off is not None:
                checked.append((off, flatten(normalize_values(read(off), off))))
        claimed = translated_keys(adapter, a, row.path) | translated_keys(adapter, b, row.path)
        if nullable(row.path):
            # the leaf unset: planned above where the sample sets it, else the sample itself
            null = checked[2] if len(checked) == 3 else None
            if row.value is None and baseline is not None:
                null = checked[0] if a is baseline else \
                    (baseline, flatten(normalize_values(read(baseline), baseline)))
            if null is not None:
                _null_apart(adapter, version, files, context, row.path, null,
                            claimed | translated_keys(adapter, null[0], row.path), surface,
                            read)
        for plan, got in checked:
            try:
                check_expected(adapter, plan, got, surface)
            except CheckFailed as exc:
                raise CheckFailed(f"{row.path} = {leaf(plan.spec, row.path)!r}: {exc}") from None
        changed = {k for k in set(read_a) | set(read_b)
                   if not same_value(read_a.get(k), read_b.get(k))}
        declared_a, _ = _flat_native(a)
        declared_b, _ = _flat_native(b)
        moved = {k for k in set(declared_a) | set(declared_b)
                 if not same_value(declared_a.get(k), declared_b.get(k))}
        if not changed & claimed and not _moot(row.path, a.validated_spec()) and \
                _same_files(a, b):
            raise CheckFailed(f"{row.path}: planned at {a_value!r} and {b_value!r}, the "
                              f"engine reads the same value for every key the translation "
                              f"claims for it ({sorted(claimed)[:4]}): the setting never "
                              "reaches the engine")
        stray = sorted(k for k in changed - claimed - moved if not also_read(k))
        if stray:
            raise CheckFailed(f"{row.path}: changing it changes {stray[:4]} as the engine "
                              "reads the launch, which its translation does not set")
        varied += 1
    return varied


def _null_apart(adapter: EngineAdapter, version: str, files: SampleFiles,
                context: dict[str, Any], path: str, null: tuple[LaunchPlan, dict[str, Any]],
                claimed: set[str], surface: dict[str, Any] | None,
                read: Callable[[LaunchPlan], dict[str, Any]]) -> None:
    """The leaf unset (null: "off") does not launch as one of its values: where the engine
    reads a value ``v`` at a key the leaf claims, and no expectation holds that key for the
    null spec, the leaf planned at ``v`` must launch otherwise. A rule that fills null with a
    value of its own (a dual clip of 3 where the spec asks for none) runs ``v`` under the
    spec's "off", and the plan records the setting as pinned. Only values a user would set
    are tried: an engine's own "off" written as a number (an unreachable bound, -1) is no
    finding, and one that is also an ordinary value is said by an expectation for null."""
    from stateset_backend.conformance.expectations import expected

    plan, got = null
    wanted = expected(adapter, plan.validated_spec(), surface, got)
    ordinary = variants(None, path)  # the values a user sets it to (an engine's default 3.0,
    # 50), not an engine's "off" written as a number no user asks for (1e9, -1, 0)
    for key in sorted(claimed):
        value = got.get(key)
        if key in wanted or not isinstance(value, int | float | str) or \
                isinstance(value, bool) or not any(same_value(value, v) for v in ordinary):
            continue
        other = plan_or_none(adapter, version, with_leaf(context, path, value), files)
        if other is None or path in {d.get("setting") for d in other.deviations}:
            continue
        if flatten(normalize_values(read(other), other)) == got and \
                _same_files(plan, other) and \
                normalize_values(_flat_native(plan)[0], plan) == \
                normalize_values(_flat_native(other)[0], other):
            raise CheckFailed(f"{path}: planned unset (null) and at {value!r}, the launch is "
                              f"the same ({key} = {value!r}): null reaches the engine as "
                              f"{value!r}; hand the engine its own \"off\", refuse null, or, "
                              "where that value is the engine's off, expect it for null")


def _check_carried_rule(adapter: EngineAdapter, version: str, origin: LaunchPlan,
                        full: dict[str, Any], files: SampleFiles,
                        read: Callable[[LaunchPlan], dict[str, Any]], row: Any,
                        spec: Any) -> int:
    """A leaf its rule carries without an engine key (``carried``: the engine's own behaviour
    already is the spec's) holds for this value only: planned at another value that is not
    refused, the launch must change, or the engine runs two settings alike. Returns 1 when a
    variant planned (the rule was moved), else 0. A leaf the sample makes moot (validation's
    top_p under greedy decoding) is tried where it counts (``ENABLED_BY``)."""
    if _moot(row.path, spec) and row.path in ENABLED_BY:
        for path, value in ENABLED_BY[row.path].items():
            full = with_leaf(full, path, value)
        enabled = plan_or_none(adapter, version, full, files)
        if enabled is None:
            return 0
        origin, spec = enabled, enabled.validated_spec()
    for value in variants(row.value, row.path):
        other = plan_or_none(adapter, version, with_leaf(full, row.path, value), files)
        if other is None:
            continue
        if _moot(row.path, spec):
            return 0
        same = flatten(normalize_values(read(origin), origin)) == \
            flatten(normalize_values(read(other), other))
        # alike where one of the two runs a deviation its release declares for the setting:
        # the plan says so (declared_deviations_run holds that claim to the launch)
        declared = {d.get("setting") for plan in (origin, other) for d in plan.deviations}
        own, _ = _flat_native(origin)
        left = sorted(k for k in translated_keys(adapter, other, row.path) if k not in own)
        if row.value is None and left and row.path not in declared:
            raise CheckFailed(f"{row.path}: unset (null), the launch leaves {left[0]} to the "
                              f"release's default, where the rule sets it at {value!r}: a "
                              "release's default is its authors' choice and may change; "
                              "hand the engine its own \"off\" for null")
        if same and row.path not in declared and _same_files(origin, other) and \
                normalize_values(_flat_native(origin)[0], origin) == \
                normalize_values(_flat_native(other)[0], other):
            raise CheckFailed(f"{row.path}: planned at {row.value!r} and {value!r}, the launch "
                              "is the same: its rule carries the setting without an engine "
                              f"key ({row.reason or 'carried'}), so the engine runs both "
                              "alike; pin it, or refuse the values the engine does not "
                              "already do")
        return 1
    return 0


def _carried(plan: LaunchPlan, path: str, native: dict[str, Any]) -> None:
    """Every key the translation pins for ``path`` (to a value: None is "leave unset") is in
    the rendered launch: a render that drops a translated key leaves the engine at its own
    default, whatever the spec says."""
    declared, _ = _flat_native(plan)
    pinned = {k: v for key, value in native.items()
              for k, v in (flatten(value, key.lstrip("+")) if isinstance(value, dict) and value
                           else {key.lstrip("+"): value}).items()}
    lost = sorted(k for k, v in pinned.items() if v is not None and k not in declared
                  and not any(d.startswith(k + ".") for d in declared))
    if lost:
        raise CheckFailed(f"{path}: its translation sets {lost[:4]}, but the rendered launch "
                          "does not carry them: the engine runs with its own default")


def check_deviations_run(adapter: EngineAdapter, version: str, base: LaunchPlan,
                         plans: list[LaunchPlan], files: SampleFiles) -> dict[str, LaunchPlan]:
    """A plan running each deviation the release's dialect declares, found among ``plans`` or
    by moving the sample specs (``reach``); the deviations none runs fail, with what was
    tried."""
    dialect = adapter.contract.dialect(parse_version(version))
    declared = {name: d.setting for name, d in dialect.deviations.items()}
    docs = [p.validated_spec().model_dump(mode="json") for p in (base, *plans)]
    reach = reach_deviations(declared, plans, docs,
                             lambda doc: plan_or_none(adapter, version, doc, files))
    missing = reach.missing(declared)
    if missing:
        shown = "; ".join(f"{name!r} on {declared[name]} (tried {', '.join(reach.tried[name])})"
                          for name in missing)
        raise CheckFailed(
            f"{adapter.name} {dialect.name} declares deviations that no sample runs: {shown}. "
            "When the spec asks for another value than the engine hard-codes, the rule for "
            "that setting must return hardcoded(engine_value, name); a deviation that never "
            "applies does not belong in the contract")
    return reach.plans


def check_expected(adapter: EngineAdapter, plan: LaunchPlan, read: dict[str, Any],
                   surface: dict[str, Any] | None) -> None:
    """The values the kit knows, from the engine itself, that the engine must read for this
    spec (``expectations``), are the ones it reads."""
    from stateset_backend.conformance.expectations import OneOf, expected
    from stateset_backend.conformance.expectations.common import MISSING

    engine = adapter.name
    for key, want in expected(adapter, plan.validated_spec(), surface, read).items():
        got = read.get(key, MISSING)
        ok = any(same_value(got, w) for w in want) if isinstance(want, OneOf) else \
            same_value(got, want)
        if not ok:
            shown = "missing" if got is MISSING else repr(got)
            raise CheckFailed(f"{key}: {engine} {plan.engine_version} reads {shown}, but for "
                              f"this spec it must read {want!r}")
        if isinstance(got, float) and _whole(want) and not _takes_float(surface, key):
            raise CheckFailed(f"{key}: {engine} {plan.engine_version} reads {got!r}, a float, "
                              f"where it takes the whole number {want!r}: a count written as "
                              "a float stops the engine where it counts with it (a range, a "
                              "tensor's shape)")
    check_deviations_declared(plan)


def _takes_float(surface: dict[str, Any] | None, key: str) -> bool:
    """Whether the release's surface says the engine's parser takes the key as a float (its
    type, or a float default): then the parser, not the launch, made the value a float."""
    option = (surface or {}).get("options", {}).get(key, {})
    return option.get("type") == "float" or isinstance(option.get("default"), float)


def _whole(want: Any) -> bool:
    """Whether an expectation is a whole number (or a choice of them): a count."""
    from stateset_backend.conformance.expectations import OneOf

    values = tuple(want) if isinstance(want, OneOf) else (want,)
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def check_deviations_declared(plan: LaunchPlan) -> None:
    """The deviations the kit knows the engine runs on this spec (expectations.deviations)
    are the ones the plan declares, no more and no fewer."""
    from stateset_backend.conformance.expectations.deviations import undeclared

    missing, extra = undeclared(plan.engine, parse_version(plan.engine_version),
                                plan.validated_spec(),
                                {d["deviation"] for d in plan.deviations})
    if missing:
        raise CheckFailed(f"{plan.engine} {plan.engine_version} runs this spec with the "
                          f"deviation {missing[0]!r}, which the plan does not declare: the "
                          "run would be recorded as the spec's math")
    if extra:
        raise CheckFailed(f"the plan declares the deviation {extra[0]!r}, which "
                          f"{plan.engine} {plan.engine_version} does not run on this spec")


