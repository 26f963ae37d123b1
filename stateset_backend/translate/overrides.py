"""Rendering native values as Hydra/OmegaConf ``key=value`` command-line overrides.

verl and NeMo RL both take their configuration as such overrides; one renderer keeps their
quoting identical and correct. A string is user data and must read back as the same literal
after two parsers: Hydra's override grammar (a string that looks like a number or holds a comma
is quoted; inside quotes a backslash escapes only a quote) and OmegaConf's resolution (``${…}``
is an interpolation, ``\\${`` a literal). A spec string holding ``${oc.env:SECRET}`` would
otherwise make the engine copy a secret into its config, logs and trackers.
"""

from __future__ import annotations

import json
import re
from typing import Any

from stateset_backend.common.errors import InvalidInput

# A leading "." is not bare: Hydra reads ".5" as a float.
_BARE = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_RESERVED = {"true", "false", "null", "none", "nan", "inf", "-inf"}
# Mapping keys Hydra's grammar reads as another type (case-insensitively); keys cannot be quoted.
_RESERVED_KEYS = {"true": "boolean", "false": "boolean", "null": "null", "nan": "float",
                  "inf": "float"}
_KEY = re.compile(r"^(~|\+\+|\+)?[A-Za-z_][A-Za-z0-9_.\-]*$")
_DICT_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_BEFORE_INTERPOLATION = re.compile(r"(\\*)\$\{")
_BEFORE_QUOTE = re.compile(r"(\\*)'")
_AT_END = re.compile(r"(\\+)$")


def literal(text: str) -> str:
    """``text`` as OmegaConf reads it back verbatim: each ``${`` preceded by k backslashes
    becomes 2k+1 backslashes, so no interpolation or resolver ever runs."""
    return _BEFORE_INTERPOLATION.sub(lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", text)


def quoted(text: str) -> str:
    """A single-quoted Hydra string: backslashes escape only a quote or the closing quote."""
    body = _BEFORE_QUOTE.sub(lambda m: "\\" * (2 * len(m.group(1)) + 1) + "'", text)
    body = _AT_END.sub(lambda m: "\\" * (2 * len(m.group(1))), body)
    return f"'{body}'"


def value(v: Any) -> str:
    """One value in Hydra's override grammar."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ",".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str) or not _DICT_KEY.match(k):
                raise InvalidInput(f"{k!r}: not a key a Hydra override can carry (letters, "
                                   "digits, '_' and '-')")
            if k.lower() in _RESERVED_KEYS:
                raise InvalidInput(f"{k!r}: Hydra reads this mapping key as a "
                                   f"{_RESERVED_KEYS[k.lower()]}, not a string, and has no "
                                   "way to quote a key")
        return "{" + ",".join(f"{k}:{value(x)}" for k, x in v.items()) + "}"
    text = literal(str(v))
    if _BARE.match(text) and text.lower() not in _RESERVED:
        return text
    return quoted(text)


def _strings(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list | tuple):
        return [t for x in v for t in _strings(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _strings(x)]
    return []


def refuse_interpolations(native: dict[str, Any], sources: dict[str, str], engine: str,
                          why: str) -> None:
    """For an engine whose read path resolves a config more than once (verl resolves it in
    place, then Hydra's ``instantiate`` resolves sections again), no escape carries ``${``
    through every read: the value would become an interpolation again and, for
    ``${oc.env:…}``, copy a secret into the run. Such a value is refused at plan time,
    naming the spec field it came from."""
    for key, v in native.items():
        for text in _strings(v):
            if "${" in text:
                field = sources.get(key, key)
                field = f"{field}.{key}" if field.startswith("engine_options.") else field
                raise InvalidInput(f"{field}: {text!r} holds '${{', which {engine} reads as an "
                                   f"OmegaConf interpolation ({why}); no escape carries it "
                                   "literally, so remove it")


def force_add_mappings(native: dict[str, Any], sources: dict[str, str],
                       engine: str) -> dict[str, Any]:
    """An ``engine_options`` mapping (verl's ``override_config``, NeMo RL's vLLM compilation
    settings) is given whole, as the option check asks, and merged into the
    engine's mapping. Both engines apply overrides in struct mode (verl's composed config, NeMo
    RL's ``parse_hydra_overrides``), where a plain override may not bring a mapping a key it
    lacks and only Hydra's force-add (``++``) may: the launch plans, and the engine refuses it
    at start-up, unless it is written so."""
    return {(f"++{key}" if isinstance(value, dict) and
             sources.get(key) == f"engine_options.{engine}" else key): value
            for key, value in native.items()}


def slug(text: str, fallback: str) -> str:
    """A user's name as one safe path component for an engine that builds folder names from
    it (letters, digits, '.', '_', '-'; never '.' or '..'; at most 64 characters)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-")[:64].strip(".-")
    return cleaned or fallback


def render(native: dict[str, Any]) -> list[str]:
    """``key=value`` for every native key, in a stable order. Keys come from adapters and
    from ``engine_options``; one that is not a plain dotted key (an ``=``, a space, an
    interpolation, a package ``@``) could rewrite the override itself, so it is refused."""
    for key in native:
        if not _KEY.match(key):
            raise InvalidInput(f"{key!r}: not a key a Hydra override can carry")
    lines = []
    for key, v in sorted(native.items()):
        try:
            lines.append(f"{key}={value(v)}")
        except InvalidInput as exc:
            raise InvalidInput(f"{key}: {exc.message}") from None
    return lines
