"""An engine launch turned into a spec, with every setting of the launch accounted for.

A team's launch is the experiment it knows; a spec it cannot compare to that launch is a
rewrite it cannot trust. So the import ends with the proof: the imported spec is planned for
the same engine and release, the plan is read back by the same reader that read the input,
and every setting the two readings disagree on is named with its reason.

Each setting the input gives ends in one fate: ``mapped`` (a spec field reproduces it),
``engine_option`` (engine-only, kept in ``engine_options`` outside the experiment's identity),
``default`` (the release's own default, restated), ``not_expressible`` (the spec or the hub
cannot carry it; the reason says why) or ``refused`` (not read at all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput, StatesetError
from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance import readers
from stateset_backend.contracts.loader import parse_version
from stateset_backend.contracts.surfaces import surface
from stateset_backend.importing.engines import (
    REWARD_FUNCTION,
    Launch,
    nemo_rl_effective,
    read_file,
)
from stateset_backend.importing.fates import (
    OBJECTIVE_PINS,
    OWNED,
    home,
    registry_datasets,
    registry_reason,
    same_input,
    textual,
    unread_alike,
    whole_mappings,
    why_not,
)
from stateset_backend.importing.roundtrip import PLACEHOLDER_SHA256, plan_dropping, read_plan
from stateset_backend.importing.solve import Solver, bare, native_of
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.model import MAX_COUNT as _MAX_UPDATES
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.rules import _same, explain_rows

# A validation split the launch's own data setup makes (NeMo RL holds part of the train set
# out): a stand-in name, kept only when the launch validates.
VALIDATION_PLACEHOLDER = "validation.jsonl"
_PROBE = "stateset-import-probe"


@dataclass
class Setting:
    key: str
    value: Any
    word: str
    fate: str
    spec_field: str | None = None
    reason: str = ""
    reproduced: bool | None = None
    planned: Any = None
    hub_owned: bool = False  # a key the hub's launch sets itself (run names, output folders)

    def to_json(self) -> dict[str, Any]:
        doc = {"key": self.key, "value": self.value, "given_as": self.word, "fate": self.fate,
               "reproduced": self.reproduced}
        if self.spec_field:
            doc["spec_field"] = self.spec_field
        if self.reason:
            doc["reason"] = self.reason
        # and where the plan's value is another that the engine reads as this one
        if self.reproduced is False or (self.reason and not _same(self.planned, self.value)):
            doc["planned"] = self.planned
        if self.hub_owned:
            doc["hub_owned"] = True
        return doc


@dataclass
class Imported:
    engine: str
    version: str
    spec: dict[str, Any]
    settings: list[Setting]
    refused: dict[str, str]
    notes: list[str]
    inputs: list[str]
    changed_defaults: list[dict[str, Any]] = field(default_factory=list)
    round_trip_error: str | None = None
    whole: tuple[int, int] = (0, 0)  # every key the engine reads: (the same, all)

    @property
    def reproduced(self) -> int:
        return sum(1 for s in self.settings if s.reproduced)

    @property
    def total(self) -> int:
        return len(self.settings) + len(self.refused)

    def to_json(self) -> dict[str, Any]:
        total = self.total
        own = [s for s in self.settings if not s.hub_owned]
        kept = sum(1 for s in own if s.reproduced)
        experiment = len(own) + len(self.refused)
        return {
            "engine": self.engine, "engine_version": self.version,
            "round_trip": {"settings": total, "reproduced": self.reproduced,
                           "percent": round(100.0 * self.reproduced / total, 1) if total
                           else 100.0,
                           "experiment_settings": experiment,
                           "experiment_reproduced": kept,
                           "experiment_percent": round(100.0 * kept / experiment, 1)
                           if experiment else 100.0,
                           "whole_configuration": {
                               "keys": self.whole[1], "same": self.whole[0],
                               "percent": round(100.0 * self.whole[0] / self.whole[1], 1)
                               if self.whole[1] else 100.0},
                           "plan_changes_defaults": self.changed_defaults,
                           **({"error": self.round_trip_error} if self.round_trip_error
                              else {})},
            "settings": [s.to_json() for s in self.settings],
            "refused": [{"given_as": w, "reason": r} for w, r in self.refused.items()],
            "inputs": self.inputs, "notes": self.notes, "spec": self.spec}


def engine_defaults(engine: str, version: str, dialect_defaults: dict[str, Any],
                    plugin_surface: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every key the release reads, at its default: the generated surface (a plugin's own,
    for a plugin's engine), and the dialect's recorded defaults for keys read outside the
    composed config."""
    out = {bare(k): v for k, v in flatten(dialect_defaults).items()}
    shipped = surface(engine, version) or plugin_surface
    for key, option in (shipped or {}).get("options", {}).items():
        out.update(flatten(option.get("default"), key) if isinstance(option.get("default"),
                                                                     dict) else
                   {key: option.get("default")})
    return out


def _probe_keys(solver: Solver, doc: dict[str, Any]) -> dict[str, list[str]]:
    """Which engine keys carry the model's path and each split's file: the rules say, when
    handed recognisable values."""
    probe = {**doc, "model": {**doc["model"], "path": f"{_PROBE}-model", "revision": None},
             "data": {**doc["data"],
                      "train": {"uri": f"{_PROBE}-train.parquet", "sha256": PLACEHOLDER_SHA256},
                      "validation": {"uri": f"{_PROBE}-validation.parquet",
                                     "sha256": PLACEHOLDER_SHA256}}}
    found: dict[str, list[str]] = {"model": [], "train": [], "validation": [], "reward": []}
    rows = solver.rows(ExperimentSpec.model_validate(probe)) or []
    for key, value in native_of(rows).items():
        for item in value if isinstance(value, list) else [value]:
            for name in ("model", "train", "validation"):
                if isinstance(item, str) and f"{_PROBE}-{name}" in item:
                    found[name].append(key)
    for row in rows:
        if row.path == "reward.entrypoint":
            found["reward"] = sorted(flatten({bare(k): v for k, v in row.native.items()}))
    return found


def _file_input(value: Any, base: Path, what: str, inputs: list[str]) -> tuple[str, str] | None:
    """(uri, sha256) of a file the launch names: hashed when it is here, a placeholder and a
    message when not."""
    if isinstance(value, list):
        if not value:
            return None
        if len(value) > 1:
            inputs.append(f"{what}: the launch names {len(value)} files; a spec split is one "
                          f"file: {value[0]!r} is imported, join the others into it")
        value = value[0]
    if not isinstance(value, str) or not value:
        return None
    at_home = home(value)
    path = Path(at_home).expanduser()
    path = path if path.is_absolute() else base / path
    if "$" in at_home or not path.is_file():
        inputs.append(f"{what}: {value} is not a file on this machine: its sha256 is a "
                      "placeholder (64 zeros); put the file there and re-run the import, or set "
                      "the digest yourself (sha256sum)" +
                      (f" ($HOME read as {Path.home()}, as ~ is)" if at_home != value else ""))
        return (str(Path(at_home).expanduser()) if at_home != value else value), PLACEHOLDER_SHA256
    inputs.append(f"{what}: {value} pinned by its sha256")
    return str(path), sha256_file(path)


def _hub_model(path: str) -> tuple[str, str | None]:
    """A Hugging Face cache snapshot folder names the hub id and the commit it holds."""
    parts = Path(path).parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        commit = parts[-1]
        if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit):
            return parts[-3].removeprefix("models--").replace("--", "/"), commit
    return path, None


def starting_spec(engine: str, launch: Launch, solver: Solver, base: Path,
                  name: str, inputs: list[str]) -> dict[str, Any]:
    """A valid spec holding the launch's model, data and reward, before any setting is
    solved."""
    doc: dict[str, Any] = {
        "name": name, "seed": 0,
        "algorithm": {"objective": "grpo", "group_size": 2, "clip": {},
                      "loss_aggregation": "token_mean", "kl": None, "advantage": {},
                      "dynamic_sampling": None, "overlong": None, "gae": None},
        "model": {"path": "model"},
        "data": {"train": {"uri": "train.parquet", "sha256": PLACEHOLDER_SHA256},
                 "max_prompt_tokens": 512, "max_response_tokens": 512},
        "reward": {"kind": "python", "entrypoint": "reward.py:score",
                   "sha256": PLACEHOLDER_SHA256},
        "budget": {"total_updates": 1}}
    doc = ExperimentSpec.model_validate(doc).model_dump(mode="json")
    keys = _probe_keys(solver, doc)
    eff = solver.effective
    model_key = next((k for k in keys["model"] if k in eff), None)
    if model_key is not None and isinstance(eff[model_key], str):
        path, commit = _hub_model(eff[model_key])
        doc["model"] = {**doc["model"], "path": path, "revision": commit}
        inputs.append(f"model: {path}" + (f" at commit {commit} (its Hugging Face cache "
                                          "snapshot)" if commit else
                                          " (no revision pinned: it loads whatever the path "
                                          "holds)"))
    else:
        inputs.append("model: the launch names no model path; model.path is a placeholder")
    for split in ("train", "validation"):
        key = next((k for k in keys[split] if k in launch.settings), None)
        if key is None:
            continue
        got = _file_input(eff[key], base, f"data.{split}", inputs)
        if got is not None:
            doc["data"][split] = {"uri": got[0], "sha256": got[1]}
    if "validation" in doc["data"] and doc["data"]["validation"] and \
            doc["data"]["validation"]["uri"] == doc["data"]["train"]["uri"]:
        doc["data"]["validation"] = None
    if not keys["validation"]:  # the engine names no validation file the rules carry
        doc["data"]["validation"] = {"uri": VALIDATION_PLACEHOLDER,
                                     "sha256": PLACEHOLDER_SHA256}
    doc["reward"] = _reward(engine, launch, keys["reward"], base, inputs)
    return doc


def _reward(engine: str, launch: Launch, keys: list[str], base: Path,
            inputs: list[str]) -> dict[str, Any]:
    file_key = next((k for k in keys if k in launch.settings and isinstance(
        launch.settings[k], str) and (launch.settings[k].endswith(".py") or
                                      ".py:" in launch.settings[k])), None)
    if file_key is None:
        inputs.append(f"reward: the launch uses {engine}'s built-in scoring (no reward file); "
                      "reward.entrypoint and reward.sha256 are placeholders: name your reward "
                      "function's file (file.py:function) and its sha256")
        return {"kind": "python", "entrypoint": "reward.py:score",
                "sha256": PLACEHOLDER_SHA256}
    name_key = next((k for k in keys if k != file_key and k.endswith("name")), None)
    function = launch.settings.get(name_key) if name_key else None
    named = str(launch.settings[file_key])
    if ".py:" in named:  # file.py:function, one value
        named, _, function = named.rpartition(":")
    function = function or REWARD_FUNCTION.get(engine, "score")
    got = _file_input(named, base, "reward", inputs)
    assert got is not None
    return {"kind": "python", "entrypoint": f"{got[0]}:{function}", "sha256": got[1]}


def _fate(key: str, fates: dict[str, tuple[str, str, str | None]],
          grouped: dict[str, str]) -> tuple[str, str, str | None]:
    """A setting's fate: a key inside a free mapping shares its mapping's, unless the guards
    refused it on its own (a part of a held mapping its release does not let in)."""
    own = fates[key]
    return own if key not in grouped or own[0] == "not_expressible" else fates[grouped[key]]


def import_file(registry: Any, engine: str, path: Path, version: str | None,
                overrides: list[str] | None = None) -> Imported:
    entry = registry.get(engine)
    adapter = entry.adapter
    version = version or adapter.contract.newest_known_version()
    dialect = adapter.contract.dialect(parse_version(version))
    if engine in readers.BUILTIN and surface(engine, version) is None:
        from stateset_backend.translate.upgrade import known_releases

        raise InvalidInput(f"import: no configuration of {engine} {version} is known to read "
                           f"the launch against (known: {', '.join(known_releases(engine))})")
    with entry.guard("reading the rules"):
        rules = adapter.rules(dialect)
        kit = adapter.kit_support()
    plugin_surface = kit.surface if engine not in readers.BUILTIN else None
    launch = read_file(engine, path, version, overrides,
                       set((plugin_surface or {}).get("options", {})))
    defaults = engine_defaults(engine, version, dict(dialect.defaults), plugin_surface)
    effective = {**defaults, **launch.settings}
    # what the launch changes from the release's defaults is what it says
    said = frozenset(k for k, v in launch.settings.items()
                     if k not in defaults or not _same(v, defaults[k]))
    solver = Solver(rules, dialect, engine, effective, said,
                    adapter.contract.provided(parse_version(version)),
                    frozenset(launch.settings) - said)
    inputs: list[str] = []
    named = next((v for k, v in launch.settings.items() if k.endswith("project_name") and
                  isinstance(v, str) and v), None)  # the engine's own name for the experiment
    doc = starting_spec(engine, launch, solver, path.resolve().parent, named or path.stem,
                        inputs)
    with entry.guard("solving the spec"):
        spec = _inputs_kept(solver.solve(doc), doc, launch.settings)
        spec = _drop_unused_validation(spec, inputs)
        counted = _updates_from_passes({**defaults, **launch.settings},
                                       spec.budget.prompts_per_update,
                                       _rows(spec, path.resolve().parent), launch.settings)
        if counted is not None and counted != spec.budget.total_updates:
            doc = spec.model_dump(mode="json")
            doc["budget"]["total_updates"] = counted
            spec = _inputs_kept(solver.solve(doc), doc, launch.settings)
    rows = explain_rows(spec, rules, dialect, engine)
    mapped = {bare(k): row.path for row in rows for k in flatten(
        {kk: vv for kk, vv in row.native.items()})}
    pinned = native_of(rows)
    options: dict[str, Any] = {}
    fates: dict[str, tuple[str, str, str | None]] = {}
    for key, value in launch.settings.items():
        if key in pinned:
            src = mapped.get(key) or next((p for k, p in mapped.items()
                                           if key.startswith(k + ".")), None)
            fates[key] = ("mapped", "", src)
        elif _same(value, defaults.get(key, object())) and key in defaults:
            fates[key] = ("default", f"{engine} {version}'s own default", None)
        else:
            options[key] = value
            fates[key] = ("engine_option", "engine-only: kept in engine_options, outside the "
                          "experiment digest", None)
    grouped = whole_mappings(engine, version, options, fates)
    spec_doc = spec.model_dump(mode="json")
    imported = Imported(engine, version, spec_doc, [], launch.refused, launch.notes, inputs)
    base = path.resolve().parent
    for attempt in range(3):
        spec_doc["engine_options"] = {engine: options} if options else {}
        try:
            plan, stand_ins = plan_dropping(entry, version, spec_doc, base, fates, engine,
                                            launch.settings)
        except StatesetError as exc:  # the spec is written; what it would launch is not known
            imported.round_trip_error = exc.message
            for key, value in launch.settings.items():
                fate, reason, src = _fate(key, fates, grouped)
                imported.settings.append(Setting(key, value, launch.words.get(key, key), fate,
                                                 src, reason, None))
            return imported
        # as planned: an option the guards refused is gone, a held mapping keeps its parts
        options = {k: v for k, v in spec_doc["engine_options"].get(engine, {}).items()
                   if fates[k][0] == "engine_option"}
        read = read_plan(engine, plan, readers.reader_for(engine, kit.parse_launch))
        # what the hub's own launch script reads (a plugin's generated script), beside the
        # engine
        read.update({k: v for k, v in plan.native.items() if k.startswith("launch.")})
        planned = {**defaults, **read}
        if engine == "nemo-rl":  # its recipe's interpolated defaults follow the plan's keys
            planned = {bare(k): v for k, v in nemo_rl_effective(version, plan.argv).items()}
        # a release default that follows another key (NeMo RL's interpolations) moves with
        # it: where the launch wrote it, the launch keeps it
        moved = [k for k, v in launch.settings.items() if fates[k][0] == "default" and
                 k in planned and not _same(planned[k], v)]
        if not moved or attempt == 2:  # the spec's options are the ones last planned
            break
        for key in moved:
            options[key] = launch.settings[key]
            fates[key] = ("engine_option", "engine-only: kept in engine_options, outside the "
                          "experiment digest (the release's default follows a key the plan "
                          "changes)", None)
    spec_doc["engine_options"] = {engine: options} if options else {}
    for key in grouped:
        fates[key] = _fate(key, fates, grouped)
    registry = registry_datasets(launch.settings, planned, fates, engine, inputs)
    for key, value in launch.settings.items():
        fate, reason, src = fates[key]
        got = planned.get(key)
        same = _same(got, value) if key in planned else key not in read and \
            _same(defaults.get(key), value)
        setting = Setting(key, value, launch.words.get(key, key), fate, src, reason, same, got)
        if not same:
            why = same_input(src, value, got, base, spec_doc, set(stand_ins.values())) or \
                unread_alike(dialect, key, value, got, effective, planned)
            if why is not None:
                same, setting.reproduced, setting.reason = True, True, why
        if not same and fate in ("mapped", "default", "engine_option"):
            setting.fate = "not_expressible"
            setting.reason = why_not(key, value, got, src, rows, engine, version)
        elif same and fate == "not_expressible":
            setting.fate, setting.reason = "mapped", "the hub's launch sets this value itself"
        pins = OBJECTIVE_PINS.match(setting.reason) if fate == "not_expressible" else None
        if not same and pins is not None:  # an option under a key the hub holds for every spec
            setting.reason = why_not(pins[1], value, planned.get(pins[1]),
                                      "algorithm.objective", rows, engine, version)
        if not same and any(key.startswith(section + ".") for section in registry):
            setting.fate, setting.reason = "not_expressible", registry_reason(
                key, value, registry, engine)
        # only the run's names, folders and loggers are the hub's: values that carry the run's
        # id or folder, and names the adapter holds for the run's identity and outputs (a
        # count or a switch it holds is the experiment's, and counts as a miss)
        setting.hub_owned = not same and src is None and (
            (isinstance(got, str) and (plan.run_id in got or "{run_dir}" in got)) or
            (key in read and OWNED in setting.reason and textual(got) and textual(value)))
        imported.settings.append(setting)
    # beyond what the launch sets: every key the release reads, launch and plan alike
    keys = [k for k in effective if k in planned]
    imported.whole = (sum(1 for k in keys if _same(planned[k], effective[k])), len(keys))
    imported.changed_defaults = [
        {"key": k, "engine_default": defaults.get(k), "planned": v, "spec_field": mapped.get(k)}
        for k, v in read.items() if k not in launch.settings and
        not _same(v, effective.get(k)) and not (isinstance(v, str) and "{run_dir}" in v)
        and v not in stand_ins.values()]
    return imported


def _inputs_kept(spec: ExperimentSpec, start: dict[str, Any],
                 settings: dict[str, Any]) -> ExperimentSpec:
    """A split's file as the import resolved it (``$HOME`` read as ``~``): the solver, which
    proposes the launch's own words, would put the word back as written."""
    doc = spec.model_dump(mode="json")
    changed = False
    for name in ("train", "validation"):
        mine, first = doc["data"].get(name), start["data"].get(name)
        if mine and first and mine["uri"] != first["uri"] and home(mine["uri"]) != \
                mine["uri"] and mine["uri"] in [str(v) for v in settings.values()]:
            mine["uri"], changed = first["uri"], True
    return ExperimentSpec.model_validate(doc) if changed else spec


def _drop_unused_validation(spec: ExperimentSpec, inputs: list[str]) -> ExperimentSpec:
    split = spec.data.validation
    if split is None or split.uri != VALIDATION_PLACEHOLDER or \
            split.sha256 != PLACEHOLDER_SHA256:
        return spec
    if spec.evaluation.every is not None:
        inputs.append(f"data.validation: the launch validates on data the engine sets up "
                      f"itself (no file the import can pin): {VALIDATION_PLACEHOLDER} with a "
                      "placeholder digest stands in; point it at your validation split")
        return spec
    doc = spec.model_dump(mode="json")
    doc["data"]["validation"] = None
    return ExperimentSpec.model_validate(doc)


def _rows(spec: ExperimentSpec, base: Path) -> int | None:
    from stateset_backend.spec.inputs import Uncountable, split_rows

    try:
        return split_rows(spec.data.train.uri, base)
    except Uncountable:
        return None


def _updates_from_passes(settings: dict[str, Any], prompts: int, rows: int | None,
                         given: dict[str, Any]) -> int | None:
    """An engine without a step limit (OpenRLHF) runs passes over the rows it keeps; the
    launch's updates are passes times rows kept over the prompts per update, which is how the
    hub's launch sizes them (and the round trip checks it)."""
    passes = next((v for k, v in settings.items() if k.endswith("num_episodes")), None)
    kept = next((v for k, v in settings.items() if k.endswith("max_samples")), None)
    if rows is None and not any(k.endswith("max_samples") for k in given):
        return None  # the data's rows decide, and they are not on this machine
    if rows is not None and isinstance(kept, int):
        kept = min(kept, rows)
    if isinstance(passes, int) and isinstance(kept, int) and prompts and kept >= prompts and \
            passes * (kept // prompts) <= _MAX_UPDATES:
        return int(passes * (kept // prompts))
    return None

