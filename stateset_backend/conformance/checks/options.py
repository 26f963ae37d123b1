"""``engine_options`` can never reach a key the launch sets, in any spelling (nor through an
alias the engine or the renderer folds onto it), nor name anything outside the engine's own
configuration (the launcher's namespace, an edit prefix, an environment variable, an
abbreviated flag, a key the release's surface lacks); the release's declared execution
defaults are the one exception, each taken and read back by the engine's own parser.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.checks.planning import CheckFailed, describe, plan_doc
from stateset_backend.conformance.samples import SampleFiles
from stateset_backend.engines.adapter import EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.translate.execution import ExecutionDefault, execution_defaults

_KEY = re.compile(r"^[+~]*-{0,2}[A-Za-z_][\w.\-/@]*$")


def key_of(element: str) -> str | None:
    """The key an argv element sets (``--flag=value`` or a Hydra ``key=value``), or None."""
    key = element.split("=", 1)[0]
    return key if "=" in element and _KEY.match(key) else None



def owned_keys(plan: LaunchPlan, option_key: str | None) -> list[str]:
    """Every key the launch sets: the plan's native keys and the keys of its ``key=value``
    argv elements (an adapter may set a key without listing it)."""
    keys = {k for k in plan.native if k != option_key}
    for element in plan.argv:
        key = key_of(element)
        if key is not None and key.lstrip("+~") != (option_key or "").lstrip("+~"):
            keys.add(key)
    return sorted(keys)


def spellings(key: str) -> list[tuple[str, Any]]:
    """Every way an ``engine_options`` entry could reach ``key``."""
    bare = key.lstrip("+~")
    if bare.startswith("-"):
        out: list[tuple[str, Any]] = [(bare, 1), (f"{bare}=x", 1)]
        if len(bare.lstrip("-")) > 3:
            out.append((bare[:-1], 1))  # argparse takes an unambiguous prefix
        return out
    out = [(bare, 1), (f"~{bare}", None), (f"+{bare}", 1), (f"++{bare}", 1), (f"{bare}=x", 1)]
    if "." in bare:
        out.append((bare.rsplit(".", 1)[0], {"x": 1}))
    return out


def plan_with_option(adapter: EngineAdapter, version: str, base: dict[str, Any],
                 files: SampleFiles, key: str, value: Any,
                 also: dict[str, Any] | None = None) -> LaunchPlan | InvalidInput:
    """The base spec planned with one ``engine_options`` entry (and ``also``, the entries it
    requires): the plan, or its refusal with exit 2. Any other outcome (a traceback, another
    exit code) fails the check."""
    doc = copy.deepcopy(base)
    doc["engine_options"] = {adapter.name: {key: value, **(also or {})}}
    try:
        return plan_doc(adapter, version, doc, files)
    except InvalidInput as exc:
        return exc
    except Exception as exc:
        raise CheckFailed(f"engine_options {key!r}: {value!r}: expected a plan or exit 2, got "
                          f"{describe(exc)}") from None


def check_option_keys(adapter: EngineAdapter, version: str, base: dict[str, Any],
                      plan: LaunchPlan, files: SampleFiles, option_key: str | None) -> int:
    """Every key the launch sets, in every spelling, as an ``engine_options`` entry: each
    must be refused with exit 2 at plan time, but the release's declared execution defaults,
    which must each be taken and read back (``check_execution_defaults``). Returns how many
    entries were tried."""
    tried = check_execution_defaults(adapter, version, base, plan, files)
    tried += check_free_mappings(adapter, version, base, plan, files)
    execution = execution_defaults(plan.resolved_dialect())
    refused: set[str] = set()  # keys of several spellings ("+k", "k") share entries
    for key in owned_keys(plan, option_key):
        for spelled, value in spellings(key):
            if key.lstrip("+~") in execution and spelled == key.lstrip("+~"):
                continue  # the exact key of an execution default: check_execution_defaults
            entry = repr((spelled, value))
            if entry in refused:
                tried += 1
                continue
            if isinstance(plan_with_option(adapter, version, base, files, spelled, value),
                          InvalidInput):
                tried += 1
                refused.add(entry)
                continue
            raise CheckFailed(f"engine_options {spelled!r} reaches {key}, which the launch "
                              "sets, and the plan was made")
    return tried


def check_option_aliases(adapter: EngineAdapter, version: str, base: dict[str, Any],
                         plan: LaunchPlan, files: SampleFiles) -> int:
    """An ``engine_options`` entry named as the last part of a key a spec setting pins
    (``lr`` for ``optim.lr``, ``learning_rate`` for ``--learning_rate``), where the plan takes
    it, leaves every key the spec pins at the value the engine read without it: an engine
    that folds its short aliases onto their keys, or a renderer that does it for the engine,
    would let an option outside the experiment's identity override the spec's setting.
    Returns how many entries were tried."""
    from stateset_backend.conformance.checks.engine_reads import same_value, translated_keys
    from stateset_backend.conformance.readers import LaunchUnreadable, reader_for

    reader = reader_for(adapter.name, adapter.kit_support().parse_launch)
    if reader is None:  # only the engine's own reading can say what an alias reaches
        return 0
    pinned = sorted(translated_keys(adapter, plan, identity=True))
    try:
        before = flatten(reader(plan))
    except LaunchUnreadable:  # the read-back check fails that launch
        return 0
    missing = object()
    aliases: dict[str, str] = {}
    for key in pinned:
        alias = key.lstrip("-").rsplit(".", 1)[-1]
        if alias and alias != key and not any(_key_is(alias, k) for k in plan.native):
            aliases.setdefault(alias, key)
    tried = 0
    for alias, key in aliases.items():
        value = _another(before.get(key))
        taken = plan_with_option(adapter, version, base, files, alias, value)
        tried += 1
        if isinstance(taken, InvalidInput):
            continue
        try:
            read = flatten(reader(taken))
        except LaunchUnreadable:  # the engine refuses the name: it fails loudly, not silently
            continue
        moved = [k for k in pinned if k in before and
                 not same_value(read.get(k, missing), before[k])]
        if moved:
            raise CheckFailed(f"engine_options {alias!r}: {value!r} planned, and the engine "
                              f"then reads {moved[0]} = "
                              f"{read.get(moved[0], 'nothing')!r}, which the spec pins at "
                              f"{before[moved[0]]!r}: an option named as a pinned key's "
                              "alias must be refused (exit 2) or reach nothing the spec sets")
    return tried


def _key_is(name: str, key: str) -> bool:
    return key.lstrip("+~-") == name


def _another(value: Any) -> Any:
    """A value of the same kind as ``value`` that no setting is likely to hold."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 3
    if isinstance(value, float):
        return value * 3 + 0.25
    if isinstance(value, str):
        return f"{value}-stateset-kit"
    return 3


def _spelled(key: str, value: Any, options: dict[str, Any]) -> tuple[str, Any]:
    """An execution default as a user gives it: by its key, or, for a key inside one of the
    release's free mappings (which the surface does not list), as that mapping whole (verl's
    attention kernel in ``override_config``)."""
    if key in options:
        return key, value
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:cut])
        if isinstance(options.get(parent, {}).get("default"), dict):
            nested: Any = value
            for part in reversed(parts[cut:]):
                nested = {part: nested}
            return parent, nested
    return key, value


def _other_value(current: Any, declared: ExecutionDefault) -> Any:
    """A value of an execution default other than the launch's own, or None where the kit
    cannot make one up (a string the engine reads as a name)."""
    if declared.values is not None:
        return next((v for v in declared.values if v != current), None)
    if isinstance(current, bool):
        return not current
    if isinstance(current, int):
        return current + 1
    return None


# Execution settings that keep the math only beside another key's value, each with a value of
# that key at which they do not: OpenRLHF's dynamic batching leaves DeepSpeed one accumulation
# step and steps after several backward passes (utils/deepspeed/deepspeed.py, ppo_actor), which
# under ZeRO-1/2 keeps only the last micro-batch's gradient. The kit plans each declared one at
# that value, which must be refused, whatever the contract says it requires.
UNSAFE_BESIDE: dict[str, dict[str, tuple[str, Any]]] = {
    "openrlhf": {"--train.dynamic_batch_enable": ("--ds.zero_stage", 2),
                 "--use_dynamic_batch": ("--zero_stage", 2)}}


def check_execution_defaults(adapter: EngineAdapter, version: str, base: dict[str, Any],
                             plan: LaunchPlan, files: SampleFiles) -> int:
    """Each execution default the release declares (none a math key: ``math_keys`` checks
    that with the other math keys) is taken from ``engine_options``: another value plans,
    and the engine's own parser reads the user's value back; a value outside its declared
    values is refused with exit 2. Returns how many entries were tried."""
    from stateset_backend.conformance.checks.engine_reads import translated_keys
    from stateset_backend.conformance.readers import reader_for
    from stateset_backend.contracts.surfaces import surface

    execution = execution_defaults(plan.resolved_dialect())
    support = adapter.kit_support()
    reader = reader_for(adapter.name, support.parse_launch)
    known = (surface(adapter.name, version) or support.surface or {}).get("options", {})
    from_spec = translated_keys(adapter, plan, identity=True)
    tried = 0
    for key, declared in execution.items():
        if key in from_spec:
            raise CheckFailed(f"{key}: declared an execution default, but the translation "
                              "sets it from a setting of the experiment: a key a spec "
                              "setting sets changes the math by that setting's own meaning "
                              "(the plan refuses an option over it)")
        value = _other_value(plan.native.get(key), declared)
        if value is None:
            continue
        also = {need: allowed[0] for need, allowed in declared.requires}
        given, as_given = _spelled(key, value, known)
        taken = plan_with_option(adapter, version, base, files, given, as_given, also)
        if isinstance(taken, InvalidInput):
            raise CheckFailed(f"engine_options {key!r}: {value!r} (an execution default): "
                              f"expected a plan, got exit 2: {taken.message}")
        if any(plan.native.get(need) not in allowed for need, allowed in declared.requires):
            alone = plan_with_option(adapter, version, base, files, key, value)
            if not isinstance(alone, InvalidInput):
                raise CheckFailed(f"engine_options {key!r}: {value!r} planned without what it "
                                  f"requires ({declared.requires_why})")
            tried += 1
        unsafe = UNSAFE_BESIDE.get(adapter.name, {}).get(key)
        if unsafe is not None:
            beside = plan_with_option(adapter, version, base, files, key, value, dict([unsafe]))
            if not isinstance(beside, InvalidInput):
                raise CheckFailed(f"engine_options {key!r}: {value!r} planned beside "
                                  f"{unsafe[0]} {unsafe[1]!r}, where the engine's code does not "
                                  "keep the math (the kit's own reading of it, UNSAFE_BESIDE)")
            tried += 1
        if reader is None:  # only the engine's own parser can say what it reads
            continue
        read = flatten(reader(taken))
        if read.get(key) != value:
            raise CheckFailed(f"engine_options {key!r}: {value!r} (an execution default) "
                              f"planned, but the engine reads {read.get(key)!r}")
        tried += 1
        if declared.values is not None:
            outside = next(v for v in (0, -1, 10**6) if v not in declared.values)
            if isinstance(plan_with_option(adapter, version, base, files,
                                       *_spelled(key, outside, known)), InvalidInput):
                tried += 1
                continue
            raise CheckFailed(f"engine_options {key!r}: {outside!r}, outside the values "
                              "declared to leave the math unchanged, and the plan was made")
    return tried


PROBE_KEY = "stateset_kit_probe"


def check_free_mappings(adapter: EngineAdapter, version: str, base: dict[str, Any],
                        plan: LaunchPlan, files: SampleFiles) -> int:
    """Each free mapping of the release (a model's config overrides, a library's kwargs: a
    surface option whose default is a mapping) that the launch leaves to the user takes a new
    key from ``engine_options``, and the engine's own parser reads it back: an engine that
    applies overrides in struct mode refuses a plain override that adds a key, so a launch
    that does not force-add it plans here and dies at start-up there. Returns how many were
    tried."""
    from stateset_backend.conformance.readers import LaunchUnreadable, reader_for
    from stateset_backend.contracts.surfaces import surface

    known = surface(adapter.name, version) or adapter.kit_support().surface or {}
    reader = reader_for(adapter.name, adapter.kit_support().parse_launch)
    if reader is None:
        return 0
    owned = {k.lstrip("+~") for k in plan.native}
    tried = 0
    for key, option in sorted(known.get("options", {}).items()):
        if not isinstance(option.get("default"), dict) or key.startswith("-") or key in owned:
            continue
        taken = plan_with_option(adapter, version, base, files, key, {PROBE_KEY: 1})
        if isinstance(taken, InvalidInput):
            continue  # held by a rule of this spec: check_option_keys holds it to that
        try:
            read = flatten(reader(taken))
        except LaunchUnreadable as exc:
            raise CheckFailed(f"engine_options {key!r} adds a key to the release's mapping "
                              f"and plans, but the engine refuses the launch: {exc}") from None
        if read.get(f"{key}.{PROBE_KEY}") != 1:
            raise CheckFailed(f"engine_options {key!r}: {{{PROBE_KEY}: 1}} planned, but the "
                              f"engine reads {read.get(f'{key}.{PROBE_KEY}')!r}")
        tried += 1
    return tried


# Keys in the launcher's or framework's namespace, never the engine's own configuration: each
# would steer what reads the launch (Hydra's output folders and search path, instantiate's
# class, the process environment, argparse's abbreviations) instead of setting the engine.
NAMESPACE_KEYS = ("hydra.run.dir", "hydra.searchpath", "hydra.job.chdir",
                  "hydra.job_logging.handlers.file.filename", "+stateset_kit.added",
                  "++stateset_kit.forced", "~stateset_kit.deleted", "LD_PRELOAD",
                  "PYTHONPATH", "-h", "stateset_kit._target_", "stateset_kit=1")
NOT_IN_ANY_SURFACE = "stateset_kit_no_such_option"


def namespace_keys(surface: dict[str, Any] | None, shipped: bool) -> list[str]:
    """NAMESPACE_KEYS; with an argparse surface, an abbreviation argparse would expand to one
    of its options; with a shipped surface (a built-in engine's, which the core holds every
    key to), a key it lacks."""
    keys = list(NAMESPACE_KEYS)
    options = sorted((surface or {}).get("options", {}))
    if options:
        flags = [o for o in options if o.startswith("--")]
        if shipped:
            keys.append(f"--{NOT_IN_ANY_SURFACE}" if flags else NOT_IN_ANY_SURFACE)
        for flag in flags:
            short = flag[:-1]
            if len(short) > 3 and short not in options:
                keys.append(short)
                break
    return keys


def check_namespace_keys(adapter: EngineAdapter, version: str, base: dict[str, Any],
                         files: SampleFiles) -> int:
    """Every key outside the engine's own configuration is refused with exit 2 at plan time,
    naming the key. Returns how many were tried."""
    from stateset_backend.contracts.surfaces import surface

    shipped = surface(adapter.name, version)
    keys = namespace_keys(shipped or adapter.kit_support().surface, shipped is not None)
    for key in keys:
        plan = plan_with_option(adapter, version, base, files, key, "/tmp/stateset-kit")
        if isinstance(plan, InvalidInput):
            if key not in plan.message:
                raise CheckFailed(f"engine_options {key!r}: refused without naming the key: "
                                  f"{plan.message}")
            continue
        raise CheckFailed(f"engine_options {key!r} is outside {adapter.name}'s own "
                          f"configuration, and the plan was made: {' '.join(plan.argv)[:300]}")
    return len(keys)
