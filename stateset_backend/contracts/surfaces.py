"""An engine release's configuration surface: every option its launch parser reads, with the
option's kind, type, choices and real default, generated from the release's own code and
shipped in ``contracts/surfaces/``.

``engine_options`` is the escape hatch for what the spec does not describe, so nothing else
stands between a typo or a wrongly typed value and the engine: a ``store_true`` flag given a
string plans fine and then argparse refuses the launch, or a misspelt option is never read.
With the surface, such a value is refused at plan time, naming the option and what it takes.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from packaging.version import Version

from stateset_backend.common.errors import InvalidInput

SURFACE_SCHEMA_ID = "stateset-backend/surface/v1"


@cache
def _shipped(engine: str) -> dict[Version, dict[str, Any]]:
    """The surfaces shipped for one engine (files named ``<engine>-<version>.json``); only
    that engine's are read, so a plan reads one engine's files, once."""
    out: dict[Version, dict[str, Any]] = {}
    folder = resources.files("stateset_backend.contracts").joinpath("surfaces")
    for item in folder.iterdir():
        if item.name.startswith(f"{engine}-") and item.name.endswith(".json"):
            doc = json.loads(item.read_text(encoding="utf-8"))
            if doc["engine"] == engine:
                out[Version(doc["version"])] = doc
    return out


def surface(engine: str, version: str) -> dict[str, Any] | None:
    """The surface of ``engine`` at ``version``: the release's own, else the newest earlier
    generated release of the same minor series (a patch release keeps its parser), else
    None (nothing is checked)."""
    known = _shipped(engine)
    wanted = Version(version)
    if wanted in known:
        return known[wanted]
    same_series = [v for v in known if v.release[:2] == wanted.release[:2] and v <= wanted]
    return known[max(same_series)] if same_series else None


def _typed(item: Any, kind: str | None) -> bool:
    if isinstance(item, bool | dict | list):
        return False
    if kind == "int":
        return isinstance(item, int)
    if kind == "float":
        return isinstance(item, int | float)
    return isinstance(item, str | int | float)


def _takes(option: dict[str, Any]) -> str:
    kind = option.get("type") or "str"
    nargs = option.get("nargs")
    if nargs is None:
        what = f"one {kind}"
    elif isinstance(nargs, int):
        what = f"a list of {nargs} {kind}s"
    else:
        what = f"a list of {kind}s"
    return what + (f" from {option['choices']}" if option.get("choices") else "")


def option_problem(name: str, option: dict[str, Any], value: Any) -> str | None:
    """Why argparse would refuse (or misread) ``value`` for the option, or None."""
    action = option["action"]
    if action in ("store_true", "store_false"):
        return None if isinstance(value, bool) else \
            f"a switch ({action}): give true or false, got {json.dumps(value)}"
    if action != "store":
        return f"a {action} option, which engine_options cannot set"
    if isinstance(value, bool) or value is None:
        return f"takes {_takes(option)}, got {json.dumps(value)}; remove it to keep the " \
               "engine's default"
    nargs = option.get("nargs")
    items = value if isinstance(value, list) and nargs is not None else [value]
    if (isinstance(nargs, int) and len(items) != nargs) or (nargs == "+" and not items):
        return f"takes {_takes(option)}, got {json.dumps(value)}"
    for item in items:
        if not _typed(item, option.get("type")):
            return f"takes {_takes(option)}, got {json.dumps(value)}"
        if option.get("choices") and item not in option["choices"]:
            return f"takes {_takes(option)}, got {json.dumps(item)}"
    return None


def check_options(engine: str, version: str, options: dict[str, Any]) -> None:
    """Every ``engine_options`` entry names an option the release's parser has, with a value
    of the kind it takes (exit 2 naming the option); without a surface, nothing is checked."""
    doc = surface(engine, version)
    if doc is None:
        return
    known: dict[str, Any] = doc["options"]
    for name, value in options.items():
        where = f"engine_options.{engine}.{name}"
        option = known.get(name)
        if option is None:
            import difflib  # only an unknown option needs it

            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
            raise InvalidInput(f"{where}: {engine} {version} has no option {name!r}" +
                               (f"; did you mean {close[0]!r}?" if close else
                                " (its parser would refuse it or read another option)"))
        problem = option_problem(name, option, value)
        if problem is not None:
            raise InvalidInput(f"{where}: {problem}")
