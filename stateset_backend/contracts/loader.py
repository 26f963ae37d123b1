"""Engine contracts: which versions an engine supports, what each version range can do, and
which flag/key dialect each version range speaks.

The contract check runs before anything is launched. It names every missing capability and the
versions that would have it, because "unsupported" without a way forward costs the user a
search through release notes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from stateset_backend.common.display import problems_text
from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.common.jsonio import read_json
from stateset_backend.contracts.capabilities import VOCABULARY
from stateset_backend.spec.digest import sha256_of

CONTRACT_SCHEMA_ID = "stateset-backend/contract/v1"


def parse_version(text: str, *, what: str = "engine version") -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise InvalidInput(f"{what} {text!r} is not a PEP 440 version (e.g. 0.9.1)") from None


@functools.cache  # contracts test the same few ranges against many versions
def _specifier(text: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(f"{text!r} is not a PEP 440 version specifier (e.g. '>=0.6,<0.8')")\
            from None


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Ranged(_Doc):
    versions: str = Field(description="PEP 440 specifier set, e.g. '>=0.6,<0.8'")

    @field_validator("versions")
    @classmethod
    def _valid_specifier(cls, value: str) -> str:
        _specifier(value)
        return value

    def contains(self, version: Version) -> bool:
        return _specifier(self.versions).contains(version, prereleases=True)


class CapabilityRange(_Ranged):
    provides: list[str] = Field(description="capability names from the closed vocabulary")

    @field_validator("provides")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        bad = sorted(set(names) - VOCABULARY)
        if bad:
            raise ValueError(f"unknown capability {', '.join(map(repr, bad))}")
        return names


class Deviation(_Doc):
    """A behaviour the engine hard-codes, named and quantified, so a run with it is comparable
    with a run without it: the reader knows exactly what differed."""

    setting: str = Field(description="the spec leaf it concerns, e.g. "
                                     "'algorithm.advantage.epsilon'")
    engine_value: Any = Field(description="what the engine does instead, in the spec's terms")
    description: str = Field(min_length=1, description="what the engine computes, quantified")
    quantity: float | None = Field(
        default=None, description="the number the engine hard-codes (a clamp, an epsilon, a "
                                  "floor) where engine_value states it in words; the "
                                  "conformance kit holds it, or a numeric engine_value, to the "
                                  "release's own code")


class Dialect(_Ranged):
    name: str = Field(description="dialect name the adapter dispatches on")
    extends: str | None = Field(default=None, description="a dialect of the same contract whose "
                                "keys, defaults and deviations this one starts from; its own "
                                "entries replace those")
    keys: dict[str, Any] = Field(default_factory=dict,
                                 description="logical slot -> native key or flag; the adapter "
                                             "validates them with its own typed model")
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="the release's own default of every native key that "
                                          "changes the math or the budget, read from its config "
                                          "or parser; every launch must set each of them")
    deviations: dict[str, Deviation] = Field(
        default_factory=dict, description="behaviours this release hard-codes, by name")


class Contract(_Doc):
    schema_id: Literal["stateset-backend/contract/v1"] = Field(alias="schema")
    engine: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    distribution: str | None = Field(description="Python distribution whose installed version "
                                                 "is the engine version; null for source "
                                                 "checkouts")
    supported: str = Field(description="PEP 440 specifier set of supported engine versions")
    capabilities: list[CapabilityRange]
    dialects: list[Dialect] = Field(min_length=1)
    gaps: dict[str, str] = Field(
        default_factory=dict, description="capability -> why no supported version provides it "
                                          "(what the engine itself lacks, or what the adapter "
                                          "does not translate yet), shown when a spec needs it")
    notes: str = ""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("gaps")
    @classmethod
    def _known_gaps(cls, gaps: dict[str, str]) -> dict[str, str]:
        bad = sorted(set(gaps) - VOCABULARY)
        if bad:
            raise ValueError(f"unknown capability {', '.join(map(repr, bad))}")
        return gaps

    @field_validator("supported")
    @classmethod
    def _valid_supported(cls, value: str) -> str:
        _specifier(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _resolve_extends(cls, data: Any) -> Any:
        """A release that renames or drops a few flags is written as the few differences, so a
        rename is one line in the contract, not a copy of fifty."""
        if not isinstance(data, dict) or not isinstance(data.get("dialects"), list):
            return data
        raw = {d.get("name"): d for d in data["dialects"] if isinstance(d, dict)}
        resolved = []
        for dialect in data["dialects"]:
            if isinstance(dialect, dict) and dialect.get("extends") is not None:
                base = raw.get(dialect["extends"])
                if base is None or base.get("extends") is not None:
                    raise ValueError(f"dialect {dialect.get('name')!r} extends "
                                     f"{dialect['extends']!r}, which is not a base dialect of "
                                     "this contract")
                dialect = {**dialect, **{part: {**base.get(part, {}), **dialect.get(part, {})}
                                         for part in ("keys", "defaults", "deviations")}}
            resolved.append(dialect)
        return {**data, "dialects": resolved}

    @model_validator(mode="after")
    def _one_dialect_per_version(self) -> Contract:
        """Every boundary version inside the supported range must have exactly one dialect."""
        supported = _specifier(self.supported)
        for probe in self._probe_versions():
            if not supported.contains(probe, prereleases=True):
                continue
            hits = [d.name for d in self.dialects if d.contains(probe)]
            if len(hits) != 1:
                raise ValueError(f"engine version {probe} matches {len(hits)} dialects "
                                 f"({', '.join(hits) or 'none'}); exactly one is required")
        return self

    def _probe_versions(self) -> set[Version]:
        probes: set[Version] = set()
        for text in [self.supported] + [r.versions for r in (*self.capabilities,
                                                             *self.dialects)]:
            for spec in _specifier(text):
                v = Version(spec.version.replace(".*", ""))
                probes.add(v)
                probes.add(Version(f"{v.base_version}.post999"))
        return probes

    # -- queries ---------------------------------------------------------------------------
    @functools.cached_property
    def digest(self) -> str:
        """Every plan records it; a frozen contract's digest is computed once."""
        return sha256_of(self.to_json())

    def to_json(self) -> dict[str, Any]:
        doc = self.model_dump(mode="json", by_alias=True)
        if not doc["gaps"]:  # a contract without gaps keeps the digest it had before them
            del doc["gaps"]
        return doc

    def supports(self, version: Version) -> bool:
        return _specifier(self.supported).contains(version, prereleases=True)

    def provided(self, version: Version) -> frozenset[str]:
        return frozenset(c for r in self.capabilities if r.contains(version) for c in r.provides)

    def all_capabilities(self) -> frozenset[str]:
        return frozenset(c for r in self.capabilities for c in r.provides)

    def versions_providing(self, capability: str) -> str | None:
        """The version ranges (within the supported range) that provide a capability."""
        ranges = [r.versions for r in self.capabilities if capability in r.provides]
        return " or ".join(ranges) if ranges else None

    def named_versions(self) -> list[Version]:
        """The releases the contract's ranges name (their bounds) that it supports, oldest
        first: where a dialect, a capability or the support begins or ends."""
        return sorted(p for p in self._probe_versions() if not p.is_postrelease
                      and self.supports(p))

    def newest_known_version(self) -> str:
        """The newest version the contract names: what ``explain --all-engines`` shows for an
        engine that is not installed here."""
        named = self.named_versions()
        return str(named[-1]) if named else self.supported

    def dialect(self, version: Version) -> Dialect:
        for d in self.dialects:
            if d.contains(version):
                return d
        raise Unsupported(f"{self.engine} {version}: no dialect covers this version "
                          f"(supported: {self.supported})")


@dataclass(frozen=True)
class Missing:
    capability: str
    available_in: str | None
    reason: str | None = None  # the contract's gap: why no version provides it

    def describe(self, engine: str) -> str:
        where = f"available in {engine} {self.available_in}" if self.available_in \
            else self.reason or f"not available in any {engine} version"
        return f"{self.capability} ({where})"


@dataclass(frozen=True)
class CheckReport:
    engine: str
    engine_version: str
    supported: str
    required: frozenset[str]
    missing: tuple[Missing, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.missing

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "engine_version": self.engine_version,
            "supported": self.supported, "ok": self.ok,
            "required": sorted(self.required),
            "missing": [{"capability": m.capability, "available_in": m.available_in}
                        for m in self.missing],
        }

    def raise_if_missing(self) -> None:
        if self.missing:
            listed = problems_text([m.describe(self.engine) for m in self.missing])
            raise Unsupported(
                f"{self.engine} {self.engine_version} cannot run this spec: missing "
                f"{listed}", details=self.to_json())


def check(contract: Contract, engine_version: str, required: frozenset[str]) -> CheckReport:
    """The contract check: raises when the version is unsupported, reports what is missing."""
    version = parse_version(engine_version)
    if not contract.supports(version):
        raise Unsupported(f"{contract.engine} {engine_version} is not supported "
                          f"(supported: {contract.engine} {contract.supported})")
    have = contract.provided(version)
    missing = tuple(Missing(cap, available, None if available else contract.gaps.get(cap))
                    for cap in sorted(required - have)
                    for available in [contract.versions_providing(cap)])
    return CheckReport(contract.engine, engine_version, contract.supported, required, missing)


def parse_contract(doc: Any, *, source: str) -> Contract:
    try:
        return Contract.model_validate(doc)
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'contract'}: "
                    f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors()]
        raise InvalidInput(f"{source}: invalid contract: " + problems_text(problems),
                           details={"problems": problems}) from None


def load_contract_file(path: str) -> Contract:
    return parse_contract(read_json(path, what="contract"), source=path)


def load_packaged_contract(package: str, filename: str) -> Contract:
    """Load a contract shipped as package data (how built-in and plugin adapters ship theirs)."""
    from stateset_backend.common.jsonio import loads

    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    return parse_contract(loads(text, source=f"{package}/{filename}"),
                          source=f"{package}/{filename}")
