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
import re
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


def outside_domain(option: dict[str, Any], value: Any) -> list[Any] | None:
    """The values a release implements for a string setting (its generated ``values``, read
    from the release's registries and dispatch; or its parser's ``choices``), where ``value``
    is not one of them; None where it is, or the release has no domain for the key."""
    allowed = option.get("values") or option.get("choices")
    if not isinstance(allowed, list) or not isinstance(value, str) or value in allowed:
        return None
    return allowed


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


# Hydra's own config namespace: a ``hydra.*`` override steers the launcher before the trainer
# runs (where it writes its .hydra/ files and job log, which folder it changes into, where it
# searches for config).
_LAUNCHER_ROOTS = ("hydra",)
# Keys Hydra's ``instantiate`` reads as instructions (which class to build, how), not settings.
_INSTANTIATE_KEYS = ("_target_", "_recursive_", "_convert_", "_partial_", "_args_")
_ENVIRONMENT_LIKE = re.compile(r"^[A-Z][A-Z0-9_]*$")
_SYNTAX = re.compile(r"[=\s@:$,{}\[\]()'\"\\]")


def namespace_problem(key: str) -> str | None:
    """Why ``key`` is not a name in an engine's own configuration, or None.

    ``engine_options`` adds engine settings the spec does not describe; a key that speaks to
    whatever reads the launch instead (an edit prefix, the launcher's own namespace, an
    instruction to Hydra's instantiate, an environment variable, override syntax, a short or
    abbreviated flag) would let a spec do what no setting of the engine can: write files
    elsewhere, load config from anywhere, or change which code runs. The rule is syntactic, so
    it holds for every engine and release, with or without a configuration surface."""
    if not key:
        return "an empty key"
    if key[0] in "+~":
        return (f"{key[0]!r} is Hydra's edit syntax (add, force-add, delete), not part of a "
                "key; engine_options may only set the engine's own keys")
    root = key.lstrip("-").split(".", 1)[0]
    if root.lower() in _LAUNCHER_ROOTS:
        return ("in Hydra's own namespace, which configures the launcher (its output and "
                "log folders, working directory, config search path), not the engine")
    leaf = key.rsplit(".", 1)[-1]
    if leaf in _INSTANTIATE_KEYS:
        return (f"{leaf} is an instruction to Hydra's instantiate (which class to build and "
                "how), not a setting")
    if _ENVIRONMENT_LIKE.match(key):
        return ("looks like an environment variable; the engine reads its environment from "
                "the machine that runs it, never from the spec")
    bad = _SYNTAX.search(key)
    if bad:
        return f"holds {bad.group()!r}, which is override syntax, not part of a key"
    if key.startswith("-") and not key.startswith("--"):
        return "a short flag; name the option by its long form (--name)"
    return None


def _open_mapping(name: str, known: dict[str, Any]) -> str | None:
    """The surface key whose value is a free mapping that ``name`` reaches inside, if any."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:i])
        if parent in known:
            return parent if isinstance(known[parent].get("default"), dict) else None
    return None


def _unknown(engine: str, version: str, name: str, known: dict[str, Any]) -> str:
    """Why an option the surface does not hold is refused, with the one fix that applies."""
    if name.startswith("--"):
        longer = sorted(k for k in known if k.startswith(name))
        if longer:
            return (f"{engine} {version} has no option {name!r}; argparse would read it as an "
                    f"abbreviation of {longer[0]!r}" + (f" (or {len(longer) - 1} other)"
                                                         if len(longer) > 1 else "") +
                    ": write the option in full")
    mapping = _open_mapping(name, known)
    if mapping is not None:
        return (f"{engine} {version}'s config has no key {name!r}; it lies inside the mapping "
                f"{mapping!r}: give that mapping whole, as {mapping!r}: {{...}}")
    import difflib  # only an unknown option needs it

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return (f"{engine} {version} has no option {name!r}" +
            (f"; did you mean {close[0]!r}?" if close else
             " in its configuration surface (the keys that release reads)"))


def check_options(engine: str, version: str, options: dict[str, Any],
                  plugin_surface: dict[str, Any] | None = None) -> None:
    """Every ``engine_options`` key is a name in the engine's own configuration (exit 2
    naming the first that is not): never the launcher's or framework's namespace, and, where
    the release's shipped surface is known (the built-in engines', generated from each
    release), one of the keys that release reads, with a value of the kind a parser option
    takes.

    ``plugin_surface`` (a plugin's ``KitSupport.surface``) is not held as the list of the
    keys engine_options may name: a plugin's surface describes what its engine reads, which
    need not be spelled as its options are, and the plugin checks its own options. It still
    shows what argparse would make of an abbreviation, which is never what a user meant."""
    for name in options:
        problem = namespace_problem(name)
        if problem is not None:
            raise InvalidInput(f"engine_options.{engine}.{name}: {problem}")
    shipped = surface(engine, version)
    if shipped is None:
        known = (plugin_surface or {}).get("options") or {}
        for name in options:
            if name.startswith("--") and name not in known and \
                    any(k.startswith(name) for k in known):
                raise InvalidInput(f"engine_options.{engine}.{name}: "
                                   f"{_unknown(engine, version, name, known)}")
        return
    known = shipped["options"]
    for name, value in options.items():
        where = f"engine_options.{engine}.{name}"
        option = known.get(name)
        if option is None:
            raise InvalidInput(f"{where}: {_unknown(engine, version, name, known)}")
        problem = option_problem(name, option, value) if "action" in option else None
        allowed = outside_domain(option, value)
        if problem is None and allowed is not None:
            problem = (f"{engine} {version} implements {', '.join(map(repr, allowed))} for it "
                       f"(read from the release's code), not {value!r}; its config would take "
                       "the value and fail, or fall through to another branch, at the first "
                       "update")
        if problem is not None:
            raise InvalidInput(f"{where}: {problem}")
