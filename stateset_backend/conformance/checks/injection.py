"""User strings are data. Hostile values in every string field of a spec and in an
``engine_options`` value keep the launch's shape and read back, through the engine's own
parser, as those values verbatim (never an interpolation resolved, never a new key); an
``engine_options`` entry can never reach a key the launch sets, in any spelling, nor name
anything outside the engine's own configuration (the launcher's namespace, an edit prefix,
an environment variable, an abbreviated flag, a key the release's surface lacks).
"""

from __future__ import annotations

import ast
import copy
import itertools
import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.checks.planning import CheckFailed, describe, plan_doc
from stateset_backend.conformance.samples import SampleFiles
from stateset_backend.engines.adapter import EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.translate.execution import ExecutionDefault, execution_defaults

# -- user strings are data -------------------------------------------------------------------------
HOSTILE = ("${oc.env:STATESET_PROBE}", "a'b", "--help", "x,y", "k=v", "a b", "\\", "[1]",
           "{a:1}", "ünï", "--lr=1", "+x=1", "~trainer")
STRING_FIELDS = ("name", "model", "prompt", "answer", "lora", "label", "option")
BENIGN = {"name": "benign", "model": "/models/benign", "prompt": "prompt", "answer": "answer",
          "lora": "q_proj", "label": "benign", "option": "benign"}


def hostile_doc(base: dict[str, Any], values: Mapping[str, str], option_key: str | None,
                engine: str, lora: bool) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    doc["name"] = values["name"]
    doc["labels"] = {"team": values["label"]}
    doc["model"] = {**doc["model"], "path": values["model"]}
    doc["model"].pop("revision", None)
    if lora:
        doc["model"]["lora"] = {"rank": 8, "alpha": 16, "target_modules": [values["lora"]]}
    for split in ("train", "validation"):
        if split in doc["data"]:
            doc["data"][split] = {**doc["data"][split], "prompt_field": values["prompt"],
                                  "answer_field": values["answer"]}
    if option_key is not None:  # None: the engine takes no free text through its options
        doc["engine_options"] = {engine: {option_key: values["option"]}}
    return doc


def check_no_free_text_option(adapter: EngineAdapter, version: str, base: dict[str, Any],
                              files: SampleFiles, option_key: str | None) -> None:
    """An engine whose kit support names no free-text option (``option_key`` gives None)
    takes only enumerated ones: a free-text key, with a hostile value, is refused with exit 2,
    never planned (and then ignored, or read as syntax)."""
    if option_key is not None:
        return
    for value in ("benign", rotations()[0]["option"]):
        taken = _with_option(adapter, version, base, files, "stateset_conformance_probe", value)
        if not isinstance(taken, InvalidInput):
            raise CheckFailed(f"{adapter.name}'s kit support names no free-text option, but "
                              f"engine_options 'stateset_conformance_probe': {value!r} planned")


def benign_refused(reason: str, option_key: str | None, adapter: EngineAdapter) -> str:
    """The failure of a benign sample that does not plan: the planner's reason, and where the
    kit's own probe key is what it refused, what the author gives instead."""
    if BENIGN["model"] in reason:
        return (f"the benign sample with every string field set does not plan: {reason}; if "
                "that is because no such folder is on this machine: a plan names the model's "
                "folder without opening it (it may be made on another machine than the run, "
                "and the hub checks inputs before a run), so refuse a model path for its text, "
                "not for being absent here (docs/plugins.md)")
    if adapter.kit_support().option_key is not None:
        return f"the benign sample with every string field set does not plan: {reason}"
    return (f"the benign sample with every string field set does not plan: {reason}; the kit "
            f"put its own probe key {option_key!r} in engine_options, as KitSupport names no "
            "option_key: name a free-text key the engine accepts, or give `option_key=lambda "
            "plan: None` when every option it takes is enumerated (docs/plugins.md)")


def rotations() -> list[dict[str, str]]:
    """Each string field gets every hostile value once over the rotations."""
    return [{f: HOSTILE[(i + j) % len(HOSTILE)] for i, f in enumerate(STRING_FIELDS)}
            for j in range(len(HOSTILE))]


def _argv(plan: LaunchPlan) -> list[str]:
    digest = plan.experiment_digest.removeprefix("sha256:")
    return [a.replace(plan.run_id, "<run-id>").replace(digest, "<digest>") for a in plan.argv]


_KEY = re.compile(r"^[+~]*-{0,2}[A-Za-z_][\w.\-/@]*$")


def _key_of(element: str) -> str | None:
    """The key an argv element sets (``--flag=value`` or a Hydra ``key=value``), or None."""
    key = element.split("=", 1)[0]
    return key if "=" in element and _KEY.match(key) else None


def check_argv_structure(clean: LaunchPlan, hostile: LaunchPlan,
                         values: Mapping[str, str]) -> None:
    """The hostile launch has the clean launch's shape: as many elements, the same flags and
    keys in the same places, no hostile option as an element of its own, and every ``${`` in
    a Hydra-style value escaped."""
    a, b = _argv(clean), _argv(hostile)
    if len(a) != len(b):
        raise CheckFailed(f"hostile values changed the number of argv elements ({len(a)} -> "
                          f"{len(b)}): {sorted(set(b) - set(a))[:5]}")
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        kx = _key_of(x)
        if kx is not None:
            if y.split("=", 1)[0] != kx:
                raise CheckFailed(f"argv element {x!r} became {y!r}: a key changed")
        elif x.startswith("-"):
            raise CheckFailed(f"the flag {x!r} became {y!r}")
    dashed = {v for v in values.values() if v.startswith("-")}
    for y in b:
        if y in dashed:
            raise CheckFailed(f"a hostile value is an argv element of its own: {y!r}")
        if "=" in y and not y.startswith("-"):
            value = y.split("=", 1)[1]
            if re.search(r"(?<!\\)\$\{", value):
                raise CheckFailed(f"an unescaped interpolation reaches a Hydra override: {y!r}")
    if set(clean.native) != set(hostile.native):
        raise CheckFailed("hostile values changed which native keys the launch sets: "
                          f"{sorted(set(clean.native) ^ set(hostile.native))[:5]}")
    check_no_script_holds_text(clean, hostile, values)


# programs whose ``-c`` argument is code, and the shell scripts a launch may write
_SHELL = re.compile(r"(?:^|/)(?:ba|da|z|k)?sh$")
_PYTHON = re.compile(r"(?:^|/)(?:python[\d.]*|\{python\})$")
_SHELL_SCRIPTS = (".sh", ".bash")


def _code(plan: LaunchPlan) -> dict[str, tuple[str, str]]:
    """{where: (language, code)}: each ``-c`` script of the argv, and each shell script file."""
    out = {}
    argv = plan.argv
    for i, (program, flag) in enumerate(itertools.pairwise(argv)):
        if flag == "-c" and i + 2 < len(argv):
            language = "sh" if _SHELL.search(program) else \
                "python" if _PYTHON.search(program) else None
            if language is not None:
                out[f"the {Path(program).name} -c script (argv {i + 2})"] = (language, argv[i + 2])
    out.update({name: ("sh", text) for name, text in plan.files.items()
                if name.endswith(_SHELL_SCRIPTS)})
    return out


def _python_shape(code: str) -> str | None:
    """The program with every string constant blanked: a user string kept a literal leaves
    it as it was; None when it does not parse."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def check_no_script_holds_text(clean: LaunchPlan, hostile: LaunchPlan,
                               values: Mapping[str, str]) -> None:
    """A user string in code a launch runs (a shell's or Python's ``-c`` script, a shell
    script among its files) stays data: in Python a literal (the program has the clean
    launch's shape once string constants are blanked), in a shell quoted as ``shlex.quote``
    quotes it. Anywhere else in a script it is syntax: a name holding ``$(...)`` runs it."""
    texts = sorted(v for v in values.values() if len(v) >= 3)
    before = _code(clean)
    for where, (language, code) in _code(hostile).items():
        if language == "python":
            if where in before and _python_shape(code) != _python_shape(before[where][1]):
                raise CheckFailed(f"hostile values changed the program of {where}: a user "
                                  "string must be written into Python as a literal (repr)")
            continue
        for text in texts:
            if text in code.replace(shlex.quote(text), ""):
                raise CheckFailed(f"the user string {text!r} is written into {where} "
                                  "unquoted, where a shell reads it as code: pass it as an "
                                  "argument, or quote it with shlex.quote")


def check_read_back(clean: dict[str, Any], hostile: dict[str, Any],
                    values: Mapping[str, str], base_dir: str | None = None) -> None:
    """What the engine's parser reads from the hostile launch differs from the clean one only
    in values that are, verbatim, hostile values; the model's value may also be joined onto
    the spec's folder, as a relative model path is (the text stays a value, one path below
    that folder). No other field's text may become a location."""
    a, b = flatten(clean), flatten(hostile)
    if a.keys() != b.keys():
        raise CheckFailed(f"the engine's parser reads other keys from the hostile launch: "
                          f"{sorted(a.keys() ^ b.keys())[:5]}")
    allowed = set(values.values())
    if base_dir is not None and "model" in values:
        allowed |= {str(f / values["model"]) for f in (Path(base_dir), Path(base_dir).resolve())}
    for key, got in b.items():
        if PROBE_SECRET in json.dumps(got):
            raise CheckFailed(f"{key}: the engine reads the value of STATESET_PROBE: an "
                              "interpolation in a user string resolved, copying an "
                              "environment variable into the run")
        if got == a[key]:
            continue
        items = got if isinstance(got, list) else [got]
        if not items or not all(isinstance(i, str) and (i in allowed or _safe_name(i))
                                for i in items):
            raise CheckFailed(f"{key}: the engine reads {got!r} (clean launch: {a[key]!r}), "
                              "which is neither a hostile value verbatim nor a name made "
                              "safe (letters, digits, '.', '_', '-')")


# The value the kit gives STATESET_PROBE while it reads launches back: nothing a launch sets
# may ever hold it. Not a safe name itself, so it can never pass as one.
PROBE_SECRET = "kit probe: secret/../value"


def _safe_name(text: str) -> bool:
    """A user's text turned into one path component by the adapter: the engine may use it
    as a folder name (verl's project name) without it choosing a location."""
    return re.fullmatch(r"[A-Za-z0-9._-]+", text) is not None and text not in (".", "..")


# -- engine_options keys ---------------------------------------------------------------------------
def owned_keys(plan: LaunchPlan, option_key: str | None) -> list[str]:
    """Every key the launch sets: the plan's native keys and the keys of its ``key=value``
    argv elements (an adapter may set a key without listing it)."""
    keys = {k for k in plan.native if k != option_key}
    for element in plan.argv:
        key = _key_of(element)
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


def _with_option(adapter: EngineAdapter, version: str, base: dict[str, Any],
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
            if isinstance(_with_option(adapter, version, base, files, spelled, value),
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
        taken = _with_option(adapter, version, base, files, alias, value)
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
        taken = _with_option(adapter, version, base, files, given, as_given, also)
        if isinstance(taken, InvalidInput):
            raise CheckFailed(f"engine_options {key!r}: {value!r} (an execution default): "
                              f"expected a plan, got exit 2: {taken.message}")
        if any(plan.native.get(need) not in allowed for need, allowed in declared.requires):
            alone = _with_option(adapter, version, base, files, key, value)
            if not isinstance(alone, InvalidInput):
                raise CheckFailed(f"engine_options {key!r}: {value!r} planned without what it "
                                  f"requires ({declared.requires_why})")
            tried += 1
        unsafe = UNSAFE_BESIDE.get(adapter.name, {}).get(key)
        if unsafe is not None:
            beside = _with_option(adapter, version, base, files, key, value, dict([unsafe]))
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
            if isinstance(_with_option(adapter, version, base, files,
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
        taken = _with_option(adapter, version, base, files, key, {PROBE_KEY: 1})
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
        plan = _with_option(adapter, version, base, files, key, "/tmp/stateset-kit")
        if isinstance(plan, InvalidInput):
            if key not in plan.message:
                raise CheckFailed(f"engine_options {key!r}: refused without naming the key: "
                                  f"{plan.message}")
            continue
        raise CheckFailed(f"engine_options {key!r} is outside {adapter.name}'s own "
                          f"configuration, and the plan was made: {' '.join(plan.argv)[:300]}")
    return len(keys)
