"""What moving one experiment from one engine release to another changes, before anyone runs it.

Every engine release silently changes someone's experiment: a flag renamed, a key moved (the
old one read by nobody), a default flipped, a behaviour newly hard-coded. The hub holds each
release's rules and its generated configuration surface, so for one spec it can say exactly
which settings change key, value, default, state or declared deviation between two releases,
which keys the older launch sets that the newer release no longer reads, and whether runs on
the two releases still carry one experiment digest's meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

from packaging.version import InvalidVersion, Version

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import flatten
from stateset_backend.contracts.loader import Dialect
from stateset_backend.contracts.surfaces import surface
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.rules import FieldRow, RuleSet, _same, explain_rows

_MISSING = object()


@dataclass(frozen=True)
class Release:
    """One engine release as the hub knows it: its dialect and the rules for it."""

    version: str
    dialect: Dialect
    rules: RuleSet


def known_releases(engine: str) -> list[str]:
    """The releases whose configuration surface the hub generated from the release itself:
    the ones whose keys and defaults it can speak for."""
    folder = resources.files("stateset_backend.contracts").joinpath("surfaces")
    found: list[Version] = []
    for item in folder.iterdir():
        stem = item.name.removesuffix(".json")
        if item.name.endswith(".json") and stem.startswith(f"{engine}-"):
            try:
                found.append(Version(stem.removeprefix(f"{engine}-")))
            except InvalidVersion:
                continue
    return [str(v) for v in sorted(found)]


def parse_range(engine: str, text: str) -> tuple[str, str]:
    """``FROM..TO``, each a release the hub knows (as the user spelt it, normalised to the
    known release: 0.5 is 0.5.0)."""
    old, sep, new = text.partition("..")
    if not sep or not old or not new:
        raise InvalidInput(f"--upgrade takes FROM..TO (e.g. 0.8.0..0.9.1), not {text!r}")
    known = known_releases(engine)
    out = []
    for given in (old, new):
        try:
            wanted = Version(given)
        except InvalidVersion:
            raise InvalidInput(f"--upgrade: {given!r} is not a version") from None
        match = next((k for k in known if Version(k) == wanted), None)
        if match is None:
            raise InvalidInput(f"--upgrade: {engine} {given} is not a release the hub knows "
                               f"(known: {', '.join(known) or 'none'})")
        out.append(match)
    if out[0] == out[1]:
        raise InvalidInput(f"--upgrade: {text} names one release twice")
    return out[0], out[1]


def _native(rows: list[FieldRow]) -> dict[str, tuple[Any, str]]:
    """Every key a launch sets, unprefixed and flattened, with the spec leaf that sets it."""
    out: dict[str, tuple[Any, str]] = {}
    for row in rows:
        for key, value in row.native.items():
            bare = key.lstrip("+")
            flat = flatten(value, bare) if isinstance(value, dict) and value else {bare: value}
            for k, v in flat.items():
                out[k] = (v, row.path)
    return out


def _defaults(engine: str, version: str, dialect: Dialect) -> dict[str, Any]:
    out = {k.lstrip("+"): v for k, v in flatten(dict(dialect.defaults)).items()}
    for key, option in (surface(engine, version) or {}).get("options", {}).items():
        default = option.get("default")
        out.update(flatten(default, key) if isinstance(default, dict) and default
                   else {key: default})
    return out


def _surface_keys(engine: str, version: str) -> set[str] | None:
    doc = surface(engine, version)
    return None if doc is None else set(doc["options"])


def _reads(keys: set[str] | None, key: str) -> bool:
    """Whether a release's configuration has the key (or a mapping it lies in)."""
    if keys is None:
        return True
    parts = key.split(".")
    return key in keys or any(".".join(parts[:i]) in keys for i in range(1, len(parts))) or \
        any(k.startswith(key + ".") for k in keys)


def _row_doc(row: FieldRow | None) -> dict[str, Any] | None:
    if row is None:
        return None
    doc: dict[str, Any] = {"state": row.state,
                           "native": {k.lstrip("+"): v for k, v in row.native.items()}}
    if row.reason:
        doc["reason"] = row.reason
    if row.deviation_name:
        doc["deviation"] = row.deviation_name
        doc["engine_value"] = row.effective
    return doc


def upgrade(spec: ExperimentSpec, engine: str, old: Release, new: Release) -> dict[str, Any]:
    """For this spec: every setting whose keys, values, state, reason or deviation differ
    between the two releases; every key whose default differs where the launch leaves it to
    the engine; the keys the older launch sets that the newer release does not read; and
    whether the experiment digest still means one experiment across the two."""
    before = {r.path: r for r in explain_rows(spec, old.rules, old.dialect, engine)}
    after = {r.path: r for r in explain_rows(spec, new.rules, new.dialect, engine)}
    settings: list[dict[str, Any]] = []
    for path in list(before) + [p for p in after if p not in before]:
        a, b = before.get(path), after.get(path)
        changes = _changes(a, b)
        if changes:
            settings.append({"field": path, "changes": changes,
                             "before": _row_doc(a), "after": _row_doc(b)})
    deviations = _deviations(before, after)
    old_native = _native(list(before.values()))
    new_native = _native(list(after.values()))
    old_defaults = _defaults(engine, old.version, old.dialect)
    new_defaults = _defaults(engine, new.version, new.dialect)
    recorded = {k.lstrip("+") for k in dict(old.dialect.defaults)} | \
        {k.lstrip("+") for k in dict(new.dialect.defaults)}
    defaults = [{"key": key, "before": old_defaults.get(key), "after": new_defaults.get(key),
                 "pinned_by": new_native[key][1] if key in new_native else None}
                for key in sorted(recorded | set(old_native) | set(new_native))
                if key in old_defaults and key in new_defaults and
                not _same(old_defaults[key], new_defaults[key])]
    defaults += _renamed_defaults(before, after, old_defaults, new_defaults, new_native)
    new_keys = _surface_keys(engine, new.version)
    dropped = []
    for key, (value, path) in sorted(old_native.items()):
        if key in new_native:
            continue
        read = _reads(new_keys, key)
        dropped.append({"key": key, "set_by": path, "value": value,
                        "newer_reads_it": read, "why": (
                            f"{engine} {new.version}'s launch no longer sets it; its config "
                            "still has the key, so an old launch that sets it is accepted and "
                            "the setting may be silently ignored" if read else
                            f"{engine} {new.version}'s config has no such key: a launch that "
                            "sets it is refused")})
    options = []
    for key, value in spec.engine_options.get(engine, {}).items():
        if not _reads(new_keys, key.lstrip("-+") if not key.startswith("--") else key):
            options.append({"key": key, "value": value,
                            "why": f"{engine} {new.version} has no such key"})
        elif key in new_defaults and key in old_defaults and \
                not _same(old_defaults[key], new_defaults[key]):
            options.append({"key": key, "value": value, "why": "its default changed"})
    holds, why = _meaning(before, after, deviations)
    return {"engine": engine, "from": old.version, "to": new.version,
            "dialects": {"from": old.dialect.name, "to": new.dialect.name},
            "settings": settings, "deviations": deviations, "defaults": defaults,
            "no_longer_read": dropped, "engine_options": options,
            "digest_meaning_holds": holds, "digest_meaning": why}


def _renamed_defaults(before: dict[str, FieldRow], after: dict[str, FieldRow],
                      old_defaults: dict[str, Any], new_defaults: dict[str, Any],
                      new_native: dict[str, tuple[Any, str]]) -> list[dict[str, Any]]:
    """A key renamed between the releases (the same leaf sets one key in each, in the same
    place) whose default changed too: the rename hides it from a key-by-key comparison."""
    out = []
    for path, a in before.items():
        b = after.get(path)
        if b is None:
            continue
        ka = [k.lstrip("+") for k in a.native]
        kb = [k.lstrip("+") for k in b.native]
        if len(ka) != len(kb) or ka == kb:
            continue
        for old_key, new_key in zip(ka, kb, strict=True):
            if old_key != new_key and old_key in old_defaults and new_key in new_defaults \
                    and not _same(old_defaults[old_key], new_defaults[new_key]):
                out.append({"key": new_key, "was": old_key, "before": old_defaults[old_key],
                            "after": new_defaults[new_key],
                            "pinned_by": new_native[new_key][1] if new_key in new_native
                            else None})
    return out


def _changes(a: FieldRow | None, b: FieldRow | None) -> list[str]:
    if a is None or b is None:
        return ["added" if a is None else "removed"]
    out = []
    if a.state != b.state:
        out.append("state")
    ka = {k.lstrip("+") for k in a.native}
    kb = {k.lstrip("+") for k in b.native}
    if ka != kb:
        out.append("key")
    shared = ka & kb
    na = {k.lstrip("+"): v for k, v in a.native.items()}
    nb = {k.lstrip("+"): v for k, v in b.native.items()}
    if any(not _same(na[k], nb[k]) for k in shared):
        out.append("value")
    if a.deviation_name != b.deviation_name or (
            a.deviation is not None and b.deviation is not None and
            a.deviation != b.deviation):
        out.append("deviation")
    if a.state == b.state == "refused" and a.reason != b.reason:
        out.append("refusal")
    elif a.state == b.state and a.reason != b.reason and "deviation" not in out:
        out.append("semantics")
    return out


def _deviations(before: dict[str, FieldRow], after: dict[str, FieldRow]) -> list[dict[str, Any]]:
    out = []
    names = {(r.deviation_name, r.path) for r in (*before.values(), *after.values())
             if r.deviation_name}
    for name, path in sorted(names, key=lambda n: (str(n[0]), n[1])):
        a, b = before.get(path), after.get(path)
        da = a.deviation if a is not None and a.deviation_name == name else None
        db = b.deviation if b is not None and b.deviation_name == name else None
        if da is None and db is not None:
            what = "appears"
        elif da is not None and db is None:
            what = "goes"
        elif da != db:
            what = "changes"
        else:
            continue
        out.append({"deviation": name, "setting": path, "what": what,
                    "before": None if da is None else da.model_dump(mode="json"),
                    "after": None if db is None else db.model_dump(mode="json")})
    return out


def _meaning(before: dict[str, FieldRow], after: dict[str, FieldRow],
             deviations: list[dict[str, Any]]) -> tuple[bool, str]:
    """The digest names the spec, not the engine: it keeps its meaning across the upgrade
    when both releases honour every identity setting the same way (pinned, or the same
    declared deviation). A refusal means the newer release cannot run it at all."""
    refused = [p for p, r in after.items() if r.state == "refused" and
               (before.get(p) is None or before[p].state != "refused")]
    if refused:
        return False, (f"the newer release refuses {', '.join(refused)}: it cannot run this "
                       "experiment")
    if deviations:
        names = ", ".join(f"{d['deviation']} ({d['what']})" for d in deviations)
        return False, (f"the declared deviations differ ({names}): runs on the two releases "
                       "share the digest but not the same computation")
    return True, ("every setting is honoured the same way on both releases (pinned, or the same "
                  "declared deviation): the digest names the same experiment on both")
