"""What a release does not tell apart: keys a switch makes inert, and values of one key its
code reads alike.

A setting whose every value computes the same cannot differ between two launches, and two
values the engine's code cannot tell apart are one setting. The import's round trip counts
either as reproduced, and its solver does not trade a setting that matters for one that does
not; without this, a launch that turns a section off by its coefficient (OpenRLHF's KL at 0)
imports as a section switched on at another coefficient, because that reproduces more of the
switched-off flags.

Each fact is declared in the contract's dialect, with the engine code that makes it so:

- ``keys.inert``: ``[{"keys": [...], "where": {switch: value}, "why": ...}]``, the keys whose
  value changes nothing the engine computes while ``switch`` holds ``value``;
- ``keys.alike``: ``{key: {"at_most": bound, "why": ...}}``, every value at or below ``bound``
  read as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stateset_backend.common.errors import AdapterBug
from stateset_backend.translate.rules import _same

INERT, ALIKE = "inert", "alike"  # the dialect slots that declare them


@dataclass(frozen=True)
class Inert:
    keys: tuple[str, ...]
    where: tuple[tuple[str, Any], ...]
    why: str


def _plain(key: str) -> str:
    """Hydra's ``+``/``++``/``~`` say how a key is given, not which key it is."""
    return key.lstrip("+~")


def _bad(dialect: Any, slot: str, shape: str) -> AdapterBug:
    return AdapterBug(f"dialect {dialect.name!r}: keys.{slot} must be {shape}, each with why "
                      "(the engine code that makes it so)")


def inert_rules(dialect: Any) -> list[Inert]:
    raw = dialect.keys.get(INERT) or []
    shape = 'a list of {"keys": [...], "where": {switch: value}, "why": ...}'
    if not isinstance(raw, list):
        raise _bad(dialect, INERT, shape)
    out = []
    for entry in raw:
        keys, where, why = (entry.get(k) for k in ("keys", "where", "why")) \
            if isinstance(entry, dict) else (None, None, None)
        if not (isinstance(keys, list) and keys and all(isinstance(k, str) for k in keys)
                and isinstance(where, dict) and where and isinstance(why, str) and why.strip()):
            raise _bad(dialect, INERT, shape)
        out.append(Inert(tuple(keys), tuple(where.items()), why))
    return out


def inert_under(dialect: Any, values: dict[str, Any]) -> dict[str, str]:
    """The keys whose value changes nothing under ``values`` (every key the engine reads: a
    launch's, or the release's default), each with why."""
    plain = {_plain(k): v for k, v in values.items()}
    out: dict[str, str] = {}
    for rule in inert_rules(dialect):
        if all(_plain(k) in plain and _same(plain[_plain(k)], v) for k, v in rule.where):
            where = ", ".join(f"{k} is {v!r}" for k, v in rule.where)
            out.update({_plain(k): f"{where}: {rule.why}" for k in rule.keys})
    return out


def read_alike(dialect: Any, key: str, a: Any, b: Any) -> str | None:
    """Why the release reads ``a`` and ``b`` of ``key`` as one value, or None where it tells
    them apart (or they are the same value)."""
    raw = dialect.keys.get(ALIKE) or {}
    if not isinstance(raw, dict):
        raise _bad(dialect, ALIKE, 'a mapping of key to {"at_most": bound, "why": ...}')
    entry = raw.get(_plain(key))
    if entry is None:
        return None
    bound, why = (entry.get("at_most"), entry.get("why")) if isinstance(entry, dict) else \
        (None, None)
    if isinstance(bound, bool) or not isinstance(bound, int | float) or \
            not isinstance(why, str) or not why.strip():
        raise _bad(dialect, ALIKE, 'a mapping of key to {"at_most": bound, "why": ...}')

    def below(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and v <= bound

    return f"every value at most {bound} reads alike: {why}" if below(a) and below(b) and \
        not _same(a, b) else None
