"""The kit's checks as plain functions: the pytest classes and the compatibility matrix call
the same code, so what the matrix shows is what the suite proves.

Each check raises :class:`CheckFailed` with the reason, or returns what it found.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from stateset_backend.common.errors import AdapterBug, InvalidInput, Unsupported
from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.reach import leaf, reach_deviations, with_leaf
from stateset_backend.conformance.samples import (
    Sample,
    SampleFiles,
    base_doc,
    deep_merge,
    samples_for,
)
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import (
    RUN_DIR,
    EngineAdapter,
    LaunchContext,
    unpinned_defaults,
)
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import LaunchPlan, make_plan
from stateset_backend.providers.local import Exit
from stateset_backend.runs.results import evaluate
from stateset_backend.spec.files import parse_spec
from stateset_backend.translate.rules import explain_rows, translate


class CheckFailed(AssertionError):
    """The adapter does not conform; the message says where and why."""


class Writer(Protocol):
    def __call__(self, attempt_dir: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                 identity: bool, artifacts: bool, checkpoint_step: int | None) -> None: ...


def entry_for(adapter: EngineAdapter) -> AdapterEntry:
    dist = adapter.contract.distribution or adapter.name
    return AdapterEntry(adapter, "conformance", dist, "0")


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
    return make_plan(parse_spec(doc), entry_for(adapter), version, base_dir=files.root)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def plannable_sample(adapter: EngineAdapter, version: str, capability: str, files: SampleFiles,
                     overrides: dict[str, Any] | None = None) -> tuple[Sample, LaunchPlan]:
    """The first sample needing a claimed ``capability`` that plans, or CheckFailed naming why
    each sample was refused."""
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
            errors.append(_describe(exc))
    # an adapter's own bug first: it is the root cause whatever else a sample runs into
    errors.sort(key=lambda e: not e.startswith("AdapterBug"))
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
    missing = unpinned_defaults(dialect, plan.native)
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
                              f"{_describe(exc)}") from None
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


# -- determinism and purity ------------------------------------------------------------------------
def normalized(plan: LaunchPlan) -> str:
    """The plan as text with what differs between two plans of one spec taken out: its run
    id and creation time (and the digests and checksum that cover them)."""
    doc = plan.to_json()
    for key in ("created_at", "checksum", "binding_digest", "run_id"):
        doc.pop(key, None)
    return json.dumps(doc, sort_keys=True).replace(plan.run_id, "<run-id>")


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + str(path.readlink())
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def check_deterministic_and_pure(adapter: EngineAdapter, version: str, sample: Sample,
                                 files: SampleFiles) -> None:
    spec = parse_spec(sample.doc)
    before_spec = copy.deepcopy(spec.model_dump(mode="json"))
    before_files = _tree(files.root)
    entry = entry_for(adapter)
    dialect = adapter.contract.dialect(parse_version(version))
    first = make_plan(spec, entry, version, base_dir=files.root)
    second = make_plan(spec, entry, version, base_dir=files.root)
    if normalized(first) != normalized(second):
        a, b = normalized(first), normalized(second)
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                  min(len(a), len(b)))
        raise CheckFailed(f"{sample.capability}: two plans of the same spec differ beyond run "
                          f"id and time: ...{a[max(0, at - 80):at + 80]}... vs "
                          f"...{b[max(0, at - 80):at + 80]}...")
    t1 = translate(spec, adapter.rules(dialect), dialect, adapter.name, version)
    t2 = translate(spec, adapter.rules(dialect), dialect, adapter.name, version)
    if t1.native != t2.native:
        raise CheckFailed(f"{sample.capability}: translation differs between two calls")
    ctx = LaunchContext("20260101T000000Z-00000000", "sha256:" + "0" * 64, version, dialect,
                        str(files.root))
    if adapter.render(t1, spec, ctx) != adapter.render(t2, spec, ctx):
        raise CheckFailed(f"{sample.capability}: render differs between two calls")
    if spec.model_dump(mode="json") != before_spec:
        raise CheckFailed(f"{sample.capability}: planning changed the spec object")
    if _tree(files.root) != before_files:
        raise CheckFailed(f"{sample.capability}: planning wrote into the spec's folder")
    check_launchers_compile(first, sample.capability)


def check_launchers_compile(plan: LaunchPlan, where: str) -> None:
    """Every Python file the launch writes is a program Python can compile."""
    for name, text in plan.files.items():
        if name.endswith(".py"):
            try:
                compile(text, name, "exec")
            except SyntaxError as exc:
                raise CheckFailed(f"{where}: the launch writes {name}, which is not valid "
                                  f"Python (line {exc.lineno}: {exc.msg})") from None


_CHILD = """
import importlib, json, sys
from pathlib import Path
from stateset_backend.conformance import checks
from stateset_backend.conformance.samples import SampleFiles
job = json.loads(sys.stdin.read())
module, _, qualname = job["adapter"].partition(":")
cls = importlib.import_module(module)
for part in qualname.split("."):
    cls = getattr(cls, part)
files = SampleFiles(Path(job["root"]), job["data_format"], job["sha256"])
plan = checks.plan_doc(cls(), job["version"], job["doc"], files)
sys.stdout.write(checks.normalized(plan))
"""


def check_plans_agree_across_processes(adapter: EngineAdapter, version: str, sample: Sample,
                                       files: SampleFiles) -> str | None:
    """The sample planned in two fresh interpreters with different ``PYTHONHASHSEED`` gives
    byte-identical plans (up to run id and time): nothing depends on set or dict order, ids
    or the process. None when it agrees; a reason when the adapter cannot be imported by
    name in a fresh interpreter (then nothing was checked)."""
    import os
    import subprocess
    import sys

    cls = type(adapter)
    if "<locals>" in cls.__qualname__:
        return f"{cls.__qualname__} is defined inside a function: a fresh interpreter " \
               "cannot import it"
    job = json.dumps({"adapter": f"{cls.__module__}:{cls.__qualname__}", "version": version,
                      "doc": sample.doc, "root": str(files.root),
                      "data_format": files.data_format, "sha256": files.sha256})
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.run([sys.executable, "-c", _CHILD], input=job, capture_output=True,
                              text=True, env=env, timeout=300)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            if "ModuleNotFoundError" in last or "AttributeError" in last:
                return f"{cls.__module__}:{cls.__qualname__} cannot be imported in a fresh " \
                       f"interpreter ({last})"
            raise CheckFailed(f"{sample.capability}: planning in a fresh interpreter failed: "
                              f"{last}")
        outputs.append(proc.stdout)
    if outputs[0] != outputs[1]:
        a, b = outputs
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                  min(len(a), len(b)))
        raise CheckFailed(f"{sample.capability}: plans made under PYTHONHASHSEED 1 and 2 "
                          f"differ: ...{a[max(0, at - 80):at + 80]}... vs "
                          f"...{b[max(0, at - 80):at + 80]}...; sort what you iterate")
    return None


# -- user strings are data -------------------------------------------------------------------------
HOSTILE = ("${oc.env:STATESET_PROBE}", "a'b", "--help", "x,y", "k=v", "a b", "\\", "[1]",
           "{a:1}", "ünï", "--lr=1", "+x=1", "~trainer")
STRING_FIELDS = ("name", "model", "prompt", "answer", "lora", "label", "option")
BENIGN = {"name": "benign", "model": "/models/benign", "prompt": "prompt", "answer": "answer",
          "lora": "q_proj", "label": "benign", "option": "benign"}


def hostile_doc(base: dict[str, Any], values: Mapping[str, str], option_key: str,
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
    doc["engine_options"] = {engine: {option_key: values["option"]}}
    return doc


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


def check_read_back(clean: dict[str, Any], hostile: dict[str, Any],
                    values: Mapping[str, str]) -> None:
    """What the engine's parser reads from the hostile launch differs from the clean one only
    in values that are, verbatim, hostile values."""
    a, b = flatten(clean), flatten(hostile)
    if a.keys() != b.keys():
        raise CheckFailed(f"the engine's parser reads other keys from the hostile launch: "
                          f"{sorted(a.keys() ^ b.keys())[:5]}")
    allowed = set(values.values())
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
def owned_keys(plan: LaunchPlan, option_key: str) -> list[str]:
    """Every key the launch sets: the plan's native keys and the keys of its ``key=value``
    argv elements (an adapter may set a key without listing it)."""
    keys = {k for k in plan.native if k != option_key}
    for element in plan.argv:
        key = _key_of(element)
        if key is not None and key.lstrip("+~") != option_key.lstrip("+~"):
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


def check_option_keys(adapter: EngineAdapter, version: str, base: dict[str, Any],
                      plan: LaunchPlan, files: SampleFiles, option_key: str) -> int:
    """Every key the launch sets, in every spelling, as an ``engine_options`` entry: each
    must be refused with exit 2 at plan time. Returns how many entries were refused."""
    tried = 0
    for key in owned_keys(plan, option_key):
        for spelled, value in spellings(key):
            doc = copy.deepcopy(base)
            doc["engine_options"] = {adapter.name: {spelled: value}}
            try:
                plan_doc(adapter, version, doc, files)
            except InvalidInput:
                tried += 1
                continue
            except Exception as exc:
                raise CheckFailed(f"engine_options {spelled!r} (reaches {key}): expected "
                                  f"exit 2, got {_describe(exc)}") from None
            raise CheckFailed(f"engine_options {spelled!r} reaches {key}, which the launch "
                              "sets, and the plan was made")
    return tried


# -- collection ------------------------------------------------------------------------------------
# the base sample's budget: 4 updates (samples.base_doc)
HEALTHY = [{"step": s, "reward/mean": 0.2 * s, "loss/policy": 0.5 / s, "kl": 0.01}
           for s in (1, 2, 3, 4)]


def _with(rows: list[dict[str, Any]], step: int, name: str, value: Any) -> list[dict[str, Any]]:
    return [dict(r, **{name: value}) if r["step"] == step else dict(r) for r in rows]


@dataclass(frozen=True)
class Case:
    name: str
    expect: str  # succeeded | invalid
    metrics: list[dict[str, Any]]
    identity: bool = True
    artifacts: bool = True
    checkpoint_step: int | None = 3
    after: str | None = None  # remove_artifacts | symlink_artifacts


COLLECTION_CASES: dict[str, Case] = {c.name: c for c in (
    Case("healthy", "succeeded", HEALTHY),
    # the bad value goes into the reward, the one metric every engine reports
    Case("nan_metric", "invalid", _with(HEALTHY, 2, "reward/mean", math.nan)),
    Case("infinite_metric", "invalid", _with(HEALTHY, 2, "reward/mean", math.inf)),
    Case("string_metric", "invalid", _with(HEALTHY, 2, "reward/mean", "NaN")),
    Case("no_artifacts", "invalid", HEALTHY, artifacts=False),
    Case("missing_artifact", "invalid", HEALTHY, after="remove_artifacts"),
    Case("artifact_symlink_outside", "invalid", HEALTHY, after="symlink_artifacts"),
    Case("missing_identity", "invalid", HEALTHY, identity=False),
    Case("no_committed_update", "invalid", [], checkpoint_step=None),
    # the engine exited 0 after 3 of the 4 planned updates: not the experiment that was asked
    Case("stopped_early", "invalid", HEALTHY[:3]),
    # a second row logged at the last update (validation metrics beside training ones): still
    # three updates, not four
    Case("two_rows_at_one_update", "succeeded",
         [*HEALTHY, {"step": 4, "reward/mean": 0.7}]),
)}


def _collect(adapter: EngineAdapter, attempt: Path, ctx: LaunchContext) -> Any:
    try:
        return adapter.collect(attempt, ctx), None
    except Exception as exc:
        return None, _describe(exc)


def check_collection(adapter: EngineAdapter, plan: LaunchPlan, case: Case, writer: Writer,
                     tmp: Path) -> str:
    attempt = tmp / "attempt"
    attempt.mkdir(parents=True)
    planned = plan.validated_spec().budget.total_updates
    if planned != len(HEALTHY):
        raise CheckFailed(f"the collection cases are written for the base sample's "
                          f"{len(HEALTHY)} updates, but its budget is {planned}: a `base` "
                          "must not change budget.total_updates")
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version,
                        plan.resolved_dialect(), plan.base_dir)
    writer(attempt, ctx, metrics=copy.deepcopy(case.metrics), identity=case.identity,
           artifacts=case.artifacts, checkpoint_step=case.checkpoint_step)
    collected, error = _collect(adapter, attempt, ctx)
    if case.after is not None:
        if collected is None or not collected.artifacts:
            raise CheckFailed(f"{case.name}: the healthy outputs list no artifact "
                              f"({error or 'collect found none'})")
        outside = tmp / "outside"
        for art in collected.artifacts:
            path = attempt / art.path
            if not path.is_file():
                continue
            if case.after == "remove_artifacts":
                path.unlink()
            else:
                target = outside / art.path
                target.parent.mkdir(parents=True, exist_ok=True)
                path.replace(target)
                path.symlink_to(target)
        collected, error = _collect(adapter, attempt, ctx)
    status, checks, _ = evaluate(plan, Exit(0), collected, attempt, collect_error=error)
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    if case.expect == "succeeded" and collected is not None:
        shown = max((int(r["step"]) for r in case.metrics), default=0)
        if collected.committed_updates != shown:
            raise CheckFailed(f"{case.name}: committed_updates is "
                              f"{collected.committed_updates}, but the outputs show {shown} "
                              f"updates (logged up to update {shown}, a checkpoint at "
                              f"{case.checkpoint_step}); count updates, not log rows, and "
                              "take them from the engine's outputs, not from the launch")
    if status != case.expect:
        raise CheckFailed(f"{case.name}: the result is {status}, expected {case.expect}"
                          + (f" ({'; '.join(failed)})" if failed else ""))
    return f"{status}" + (f" ({failed[0]})" if failed else "")


def check_resume(adapter: EngineAdapter, plan: LaunchPlan, writer: Writer, tmp: Path) -> str:
    earlier, new = tmp / "attempts" / "1", tmp / "attempts" / "2"
    earlier.mkdir(parents=True)
    new.mkdir(parents=True)
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version,
                        plan.resolved_dialect(), plan.base_dir)
    writer(earlier, ctx, metrics=copy.deepcopy(HEALTHY), identity=True, artifacts=True,
           checkpoint_step=3)
    found = adapter.latest_checkpoint(earlier)
    if found is None:
        raise CheckFailed("resume:exact is claimed, but latest_checkpoint finds no checkpoint "
                          "in an attempt the writer gave one (update 3)")
    if found.update != 3:
        raise CheckFailed(f"latest_checkpoint reports update {found.update}, the writer wrote 3")
    problem = adapter.checkpoint_problem(found, plan.experiment_digest)
    if problem is not None:
        raise CheckFailed(f"a whole checkpoint of this experiment is refused: {problem}")
    before = _tree(earlier)
    argv = [a.replace(RUN_DIR, str(new)) for a in plan.argv]
    resumed = adapter.resume_argv(found, list(argv), new)
    if _tree(earlier) != before:
        raise CheckFailed("resume_argv changed the earlier attempt's directory")
    if not all(isinstance(a, str) for a in resumed):
        raise CheckFailed("resume_argv returns an argv with non-string elements")
    staged = adapter.latest_checkpoint(new)
    if resumed == argv and (staged is None or staged.update != found.update):
        raise CheckFailed("resume_argv neither changes the launch nor stages the checkpoint "
                          "in the new attempt: the engine would start from scratch")
    lost = [a for a in argv if str(new) in a and a not in resumed]
    if lost:
        raise CheckFailed(f"the resumed launch no longer writes into the new attempt: {lost[0]!r}"
                          " is gone")
    into_old = [a for a in resumed if a not in argv and str(earlier) in a and
                str(found.path) not in a]
    if into_old:
        raise CheckFailed(f"the resumed launch points into the earlier attempt beyond its "
                          f"checkpoint: {into_old[0]!r}")
    return f"continues from update {found.update}"


def fitted_base(adapter: EngineAdapter, version: str, files: SampleFiles,
                overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The base, with every setting the release hard-codes (and refuses otherwise) moved to
    the release's value, so the base plans without per-engine hand-written specs."""
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


def _nested(path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


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
    doc = deep_merge(fitted_base(adapter, version, files, overrides), extra)
    try:
        return doc, plan_doc(adapter, version, doc, files)
    except Exception as exc:
        raise CheckFailed(f"the base sample does not plan on {adapter.name} {version}: "
                          f"{_describe(exc)}") from None


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
def _variants(value: Any) -> list[Any]:
    """Two values distinct from each other and from ``value``, of its type, small moves that
    specs usually accept (tried in order; those the spec or the engine refuses are skipped)."""
    if isinstance(value, bool) or value is None:
        return []
    tries: list[Any]
    if isinstance(value, int):
        tries = [value + 1, value + 2, value * 2, value + 3, value * 4, value - 1]
    elif isinstance(value, float):
        tries = [value * 0.5, value * 0.75, value * 1.25, value + 0.05, value + 0.1] \
            if value else [0.01, 0.02, 0.05]
    else:
        return []
    return [v for v in dict.fromkeys(tries) if v != value]


def _plan_or_none(adapter: EngineAdapter, version: str, doc: dict[str, Any],
                  files: SampleFiles) -> LaunchPlan | None:
    try:
        return plan_doc(adapter, version, doc, files)
    except (InvalidInput, Unsupported):
        return None


def _claimed(adapter: EngineAdapter, plan: LaunchPlan, path: str) -> set[str]:
    """The native keys the plan's translation says ``path`` sets (dotted, without '+')."""
    dialect = plan.resolved_dialect()
    rows = explain_rows(plan.validated_spec(), adapter.rules(dialect), dialect, adapter.name)
    out: set[str] = set()
    for row in rows:
        if row.path == path:
            for key, value in row.native.items():
                bare = key.lstrip("+")
                out |= set(flatten(value, bare)) if isinstance(value, dict) and value \
                    else {bare}
    return out


def _moot(path: str, spec: Any) -> bool:
    """Settings the spec's own meaning makes moot in this sample, whatever the engine (the
    kit's knowledge of the spec, not of any adapter): a launch may pin them at anything."""
    return path == "optim.min_lr_ratio" and spec.optim.schedule == "constant"


def check_sensitivity(adapter: EngineAdapter, version: str, base: dict[str, Any],
                      files: SampleFiles, read: Callable[[LaunchPlan], dict[str, Any]],
                      also_read: Callable[[str], bool] = lambda key: False,
                      surface: dict[str, Any] | None = None) -> int:
    """For every numeric leaf the translation pins onto engine keys: the sample planned at
    two more values (distinct from each other and the base) and read back as the engine reads
    it. At least one claimed key must read differently (the setting reaches the engine), and
    every key that reads differently must be one the translation says changed (no setting
    leaks into keys it does not claim). Returns how many leaves were varied."""
    dialect = adapter.contract.dialect(parse_version(version))
    origin = plan_doc(adapter, version, base, files)
    spec = origin.validated_spec()
    rows = explain_rows(spec, adapter.rules(dialect), dialect, adapter.name)
    full = spec.model_dump(mode="json")
    varied = 0
    for row in rows:
        if row.state != "pinned" or not row.native or row.path.split(".")[0] in (
                "resources", "seed", "engine_options"):
            continue
        plans = []
        for value in _variants(row.value):
            plan = _plan_or_none(adapter, version, with_leaf(full, row.path, value), files)
            if plan is not None:
                plans.append((value, plan))
            if len(plans) == 2:
                break
        if len(plans) < 2:
            continue
        (a_value, a), (b_value, b) = plans
        read_a = flatten(normalize_values(read(a), a))
        read_b = flatten(normalize_values(read(b), b))
        for plan, got in ((a, read_a), (b, read_b)):
            try:
                check_expected(adapter.name, plan, got, surface)
            except CheckFailed as exc:
                raise CheckFailed(f"{row.path} = {leaf(plan.spec, row.path)!r}: {exc}") from None
        changed = {k for k in set(read_a) | set(read_b)
                   if not same_value(read_a.get(k), read_b.get(k))}
        claimed = _claimed(adapter, a, row.path) | _claimed(adapter, b, row.path)
        declared_a, _ = _flat_native(a)
        declared_b, _ = _flat_native(b)
        moved = {k for k in set(declared_a) | set(declared_b)
                 if not same_value(declared_a.get(k), declared_b.get(k))}
        if not changed & claimed and not _moot(row.path, spec):
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


# Objectives whose math differs whatever the other settings are: two of different classes
# must never launch alike (an adapter that claims rloo and launches grpo fails here).
OBJECTIVE_CLASSES = {"grpo": "group", "dr_grpo": "group", "dapo": "group", "gspo": "gspo",
                     "cispo": "cispo", "rloo": "rloo", "reinforce_pp": "reinforce_pp",
                     "ppo": "ppo"}
DISTINCT_LEAVES = {"algorithm.kl.estimator": ("k1", "k2", "k3"),
                   "algorithm.loss_aggregation": ("token_mean", "seq_mean_token_mean",
                                                  "seq_mean_token_sum",
                                                  "seq_mean_token_sum_norm")}


def check_distinct_launches(adapter: EngineAdapter, version: str, base: dict[str, Any],
                            files: SampleFiles,
                            read: Callable[[LaunchPlan], dict[str, Any]]) -> int:
    """Different estimators, aggregations and objectives (with every other setting held)
    launch differently, as the engine reads them. Returns how many pairs were compared."""
    origin = plan_doc(adapter, version, base, files)
    full = origin.validated_spec().model_dump(mode="json")
    compared = 0

    def launches(doc: dict[str, Any]) -> dict[str, Any] | None:
        plan = _plan_or_none(adapter, version, doc, files)
        if plan is None:
            return None
        out = flatten(normalize_values(read(plan), plan))
        return {k: v for k, v in out.items() if "<run-id>" not in str(v)}

    for path, values in DISTINCT_LEAVES.items():
        if path.startswith("algorithm.kl.") and full["algorithm"].get("kl") is None:
            held = with_leaf(full, "algorithm.kl", {"coef": 0.01, "estimator": "k1",
                                               "placement": "loss"})
        else:
            held = full
        seen: dict[str, Any] = {}
        for value in values:
            got = launches(with_leaf(held, path, value))
            if got is None:
                continue
            for other, launched in seen.items():
                compared += 1
                if launched == got:
                    raise CheckFailed(f"{path}: {other!r} and {value!r} launch alike as the "
                                      "engine reads them; one of them is not what it claims")
            seen[value] = got
    for first in OBJECTIVE_CLASSES:
        for second in OBJECTIVE_CLASSES:
            if first >= second or OBJECTIVE_CLASSES[first] == OBJECTIVE_CLASSES[second]:
                continue
            for recipe in (first, second):  # every other setting held at one recipe's
                try:
                    filled = parse_spec(with_leaf(base, "algorithm.objective", recipe)) \
                        .model_dump(mode="json")
                except InvalidInput:
                    continue
                a = launches(with_leaf(filled, "algorithm.objective", first))
                b = launches(with_leaf(filled, "algorithm.objective", second))
                if a is None or b is None:
                    continue
                compared += 1
                if a == b:
                    raise CheckFailed(f"algorithm.objective: {first!r} and {second!r} launch "
                                      "alike as the engine reads them (other settings held "
                                      f"at {recipe}'s); one of them is not what it claims")
                break
    return compared


def check_deviations_run(adapter: EngineAdapter, version: str, base: LaunchPlan,
                         plans: list[LaunchPlan], files: SampleFiles) -> dict[str, LaunchPlan]:
    """A plan running each deviation the release's dialect declares, found among ``plans`` or
    by moving the sample specs (``reach``); the deviations none runs fail, with what was
    tried."""
    dialect = adapter.contract.dialect(parse_version(version))
    declared = {name: d.setting for name, d in dialect.deviations.items()}
    docs = [p.validated_spec().model_dump(mode="json") for p in (base, *plans)]
    reach = reach_deviations(declared, plans, docs,
                             lambda doc: _plan_or_none(adapter, version, doc, files))
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


def check_expected(engine: str, plan: LaunchPlan, read: dict[str, Any],
                   surface: dict[str, Any] | None) -> None:
    """The values the kit knows, from the engine itself, that the engine must read for this
    spec (``expectations``), are the ones it reads."""
    from stateset_backend.conformance.expectations import OneOf, expected

    for key, want in expected(engine, plan.validated_spec(), surface).items():
        got = read.get(key, _MISSING)
        ok = any(same_value(got, w) for w in want) if isinstance(want, OneOf) else \
            same_value(got, want)
        if not ok:
            shown = "missing" if got is _MISSING else repr(got)
            raise CheckFailed(f"{key}: {engine} {plan.engine_version} reads {shown}, but for "
                              f"this spec it must read {want!r}")


_MISSING = object()
