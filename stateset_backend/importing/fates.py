"""Why each setting of a launch ends where it does, when the imported spec's plan does not
give it back as the launch gave it: the reasons the import screen prints, and the few readings
under which the plan's value is the launch's after all (a file by its absolute path, ``$HOME``
as ``~``, a key inside one of the release's free mappings offered as the mapping whole, a key
whose value changes nothing on either side, two values the release reads as one).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from stateset_backend.common.jsonio import put
from stateset_backend.contracts.surfaces import surface
from stateset_backend.importing.roundtrip import PLACEHOLDER_SHA256
from stateset_backend.translate.reading import inert_under, read_alike
from stateset_backend.translate.rules import _same

# The spec's token limits, which engines read as one sequence limit and one response limit.
_LIMITS = ("data.max_prompt_tokens", "data.max_response_tokens", "data.max_total_tokens")
# The hub's guard refusing an engine option on a key the adapter holds for the run itself.
OWNED = "set by stateset-backend to keep the run's identity and outputs"
# The hub's guard refusing an engine option under a key the objective's rule holds, or one
# the launch holds for every spec.
OBJECTIVE_PINS = re.compile(r"(?:overrides the key that algorithm\.objective pins \(|reaches )"
                            r"([^),]+)(?:\)|, which the launch holds at )")


def whole_mappings(engine: str, version: str, options: dict[str, Any],
                    fates: dict[str, tuple[str, str, str | None]]) -> dict[str, str]:
    """Keys a launch sets inside one of the release's free mappings (vLLM's kwargs, a
    model's config overrides) go to engine_options as that mapping whole, the only spelling
    the hub's guards take: each such key is returned with its mapping, whose fate it shares."""
    shipped = surface(engine, version)
    if shipped is None:
        return {}
    known = shipped["options"]
    grouped: dict[str, str] = {}
    for key in options:
        if key in known:
            continue
        parts = key.split(".")
        parent = next((p for p in (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1))
                       if p in known), None)
        if parent is not None and isinstance(known[parent].get("default"), dict):
            grouped[key] = parent
    for key, mapping in grouped.items():
        whole = options.setdefault(mapping, copy.deepcopy(known[mapping]["default"]))
        put(whole, key[len(mapping) + 1:], options.pop(key))
        fates[mapping] = fates[key]
    return grouped


def registry_datasets(settings: dict[str, Any], planned: dict[str, Any],
                       fates: dict[str, tuple[str, str, str | None]], engine: str,
                       inputs: list[str]) -> dict[str, str]:
    """The splits a launch names by a dataset of the engine's own registry (NeMo RL's
    ``dataset_name: DeepScaler``), by section: the engine downloads and formats those itself,
    while a spec's split is a file pinned by its content, so the spec holds a placeholder and
    the user is told which file to make."""
    found: dict[str, str] = {}
    for key, value in settings.items():
        src = fates[key][2]
        if not key.endswith(".dataset_name") or not isinstance(value, str) or \
                src not in ("data.train.uri", "data.validation.uri") or \
                _same(planned.get(key), value):
            continue
        found[key.rsplit(".", 1)[0]] = value
        split = src.rsplit(".", 1)[0]
        inputs[:] = [line for line in inputs if not line.startswith(f"{split}: the launch "
                                                                   "validates on data")]
        inputs.append(f"{src.rsplit('.', 1)[0]}: the launch names {value!r}, a dataset of "
                      f"{engine}'s own data registry, not a file: {src} is a placeholder; "
                      f"write that split as JSON lines (a prompt and an answer field per row) "
                      f"and point {src} at it")
    return found


def registry_reason(key: str, value: Any, registry: dict[str, str], engine: str) -> str:
    section = max((s for s in registry if key.startswith(s + ".")), key=len)
    name = registry[section]
    if key == f"{section}.dataset_name":
        return (f"{value!r} is a dataset of {engine}'s own data registry, which the engine "
                "downloads and formats itself; a spec split is a file pinned by its sha256, so "
                "the spec's split is a placeholder (see inputs)")
    return (f"an option of {engine}'s registry dataset {name!r}, which the spec's file split "
            "replaces: write the split's rows as this option would give them")


def textual(value: Any) -> bool:
    """A name, a path or a list of them (loggers), never a count or a switch."""
    return isinstance(value, str) or (isinstance(value, list) and all(
        isinstance(item, str) for item in value))


def same_input(src: str | None, value: Any, got: Any, base: Path, spec: dict[str, Any],
                stand_ins: set[str]) -> str | None:
    """Why the plan's value is the launch's input after all, or None: a file the launch names
    relative to where it runs, a reward the hub calls through its shim, a split that is not on
    this machine (the round trip plans a stand-in of the rows the launch keeps)."""
    if src not in ("data.train.uri", "data.validation.uri", "reward.entrypoint"):
        return None
    if src == "reward.entrypoint":
        return None if spec["reward"].get("sha256") in (None, PLACEHOLDER_SHA256) else \
            "the hub's reward shim loads this file, checked by its sha256"
    if isinstance(got, str) and got in stand_ins:
        return ("not on this machine: the round trip planned a stand-in split of the rows the "
                "launch keeps")
    if isinstance(value, list) and len(value) == 1:  # the engine reads one file or a list
        value = value[0]
    if isinstance(value, str) and isinstance(got, str) and "$" not in home(value) and \
            (base / Path(home(value)).expanduser()).resolve() == Path(got).resolve():
        return "the same file, named by its absolute path" if Path(got).is_file() else \
            "the same path (the file is not on this machine: see inputs)"
    return None


def home(value: str) -> str:
    """``$HOME/...`` as ``~/...``: the shell gives both the home of the user who runs the
    launch, and the import reads ``~`` as this user's."""
    for prefix in ("$HOME/", "${HOME}/"):
        if value.startswith(prefix):
            return "~/" + value[len(prefix):]
    return value


def why_not(key: str, value: Any, got: Any, src: str | None, rows: Any, engine: str,
             version: str) -> str:
    if src is not None and isinstance(value, str) and "$" in value:
        return (f"holds a shell variable the import does not expand: {src} keeps "
                f"{value!r} as written, which the plan reads relative to the spec's folder; "
                "write the real path there")
    if src in ("data.train.uri", "data.validation.uri") and isinstance(value, list) and \
            len(value) > 1:
        return (f"the launch reads {len(value)} files as one split, a spec split is one file: "
                f"{src} names the first (join the others into it; see inputs)")
    if src in _LIMITS:
        return (f"{src} translates to {key}={got!r}, where the launch gives {value!r}: no "
                "choice of the spec's prompt, response and shared limits (data.max_prompt_tokens, "
                f"max_response_tokens, max_total_tokens) reads back on {engine} {version} as the "
                "launch's limits")
    if src == "algorithm.objective":
        return (f"the hub's launch holds {key} at {got!r} for every spec, a setting the spec "
                "has no name for, kept where the run is the spec's experiment; no spec value "
                f"gives {value!r} on {engine} {version}")
    if src is not None:
        row = next((r for r in rows if r.path == src), None)
        how = f" ({row.reason})" if row is not None and row.reason else ""
        return (f"{src} translates to {key}={got!r}{how}; no value of it gives {value!r} on "
                f"{engine} {version}")
    return f"the hub's launch sets {key}={got!r} itself"


def unread_alike(dialect: Any, key: str, value: Any, got: Any, effective: dict[str, Any],
                 planned: dict[str, Any]) -> str | None:
    """Why a setting the plan gives another value is still the launch's: its value changes
    nothing under the launch's values and the plan's alike, or the release reads the two
    values as one."""
    if key in planned:
        launch_unread = inert_under(dialect, effective).get(key.lstrip("+~"))
        if launch_unread is not None and key.lstrip("+~") in inert_under(dialect, planned):
            return f"changes nothing where {launch_unread}, in the launch as in the plan"
    return read_alike(dialect, key, value, got)
