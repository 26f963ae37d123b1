"""Reading a spec from disk into an ExperimentSpec, with every problem as ``path.to.field: msg``.

A user fixing a spec wants all problems at once, each pointing at the field, and a hint when
an unknown key is a near-miss of a real one (``grup_size`` → ``group_size``).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from stateset_backend.common.display import problems_text
from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import read_json
from stateset_backend.spec.inputs import check_input_files, local_paths
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.modeltree import model_in


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model reached by following ``loc`` from ``model``."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return []
        current = model_in(current.model_fields[part].annotation)
    return list(current.model_fields) if current is not None else []


def _dotted(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and (
        p.startswith("function-") or p in {"literal", "none", "list[str]"} or "[" in p))]
    return ".".join(parts) or "spec"


def format_errors(exc: ValidationError, model: type[BaseModel] = ExperimentSpec) -> list[str]:
    """One ``path: message`` line per problem, with 'did you mean' for near-miss keys."""
    lines: list[str] = []
    seen: set[str] = set()
    errors = exc.errors(include_url=False)
    # A missing or unknown objective leaves its recipe unfilled: every key the recipe would
    # have given is then "Field required", noise that hides the one problem to fix.
    no_recipe = {tuple(e["loc"][:-1]) for e in errors if e["loc"] and e["loc"][-1] == "objective"}
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "missing" and loc[:-1] in no_recipe and loc[-1] != "objective":
            continue
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            import difflib  # only a spec with an unknown key needs it

            known = _fields_at(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            msg = "unknown key" + (f"; did you mean '{close[0]}'?" if close else "")
        line = f"{_dotted(loc)}: {msg}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


# Launch placeholders (engines.adapter): filled in when a plan runs. User text must never hold one,
# or the substitution would rewrite it.
PLACEHOLDERS = ("{run_dir}", "{python}", "{engine_home}")
SAFE_INTEGER = 2**53 - 1  # RFC 8785 (I-JSON): larger integers have no exact canonical form
MAX_DEPTH = 32
_UNCARRIABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def carriable_problems(doc: Any, path: str = "", depth: int = 0) -> list[str]:
    """Values no engine can carry or no digest can hash, found before validation so each is
    one ``path: message`` line instead of a crash deep in hashing or launching: integers
    outside the exact range of canonical JSON, NUL and other control characters, lone
    surrogates (not encodable as UTF-8), and absurd nesting."""
    where = path or "spec"
    if depth > MAX_DEPTH:
        return [f"{where}: nested deeper than {MAX_DEPTH} levels"]
    if isinstance(doc, bool):
        return []
    if isinstance(doc, float) and not math.isfinite(doc):
        return [f"{where}: {doc} is not a finite number (NaN and infinities are rejected)"]
    if isinstance(doc, int):
        return [f"{where}: integer outside ±(2^53-1), which canonical JSON cannot carry "
                "exactly"] if abs(doc) > SAFE_INTEGER else []
    if isinstance(doc, str):
        bad = _UNCARRIABLE.search(doc)
        if bad:
            return [f"{where}: contains the character U+{ord(bad.group()):04X}, which no "
                    "engine can carry"]
        placeholder = next((p for p in PLACEHOLDERS if p in doc), None)
        return [f"{where}: contains {placeholder}, which launches reserve for the paths they "
                "fill in"] if placeholder else []
    problems: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            child = f"{path}.{key}" if path else str(key)
            problems += carriable_problems(key, child + " (key)", depth + 1)
            problems += carriable_problems(value, child, depth + 1)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            problems += carriable_problems(value, f"{where}.{i}", depth + 1)
    return problems


_SECRET_KEY = re.compile(r"(^|[_.-])(api[_-]?key|token|access[_-]?key|secret([_-]?key)?|"
                         r"password|passwd|credentials?|private[_-]?key)$", re.IGNORECASE)
_URI_USERINFO = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#@]*@")
_SECRET_QUERY = re.compile(r"[?&](token|access_token|api[_-]?key|key|sig|signature|password|"
                           r"x-amz-signature|x-goog-signature|sv)=", re.IGNORECASE)


def secret_problems(doc: Any, path: str = "") -> list[str]:
    """Credentials have no place in a spec: it is copied into plans that are shared and
    reviewed, and into the run store. They reach an engine through environment variables,
    which plans list by name only."""
    problems: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            child = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and _SECRET_KEY.search(key):
                problems.append(f"{child}: looks like a credential; pass it to the engine "
                                "through an environment variable, never in the spec")
            else:
                problems += secret_problems(value, child)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            problems += secret_problems(value, f"{path}.{i}")
    elif isinstance(doc, str) and (_URI_USERINFO.search(doc) or (
            "://" in doc and _SECRET_QUERY.search(doc))):
        problems.append(f"{path or 'spec'}: a URI carrying credentials (user info or a "
                        "credential query parameter); use an environment variable")
    return problems


NAME_MAX = 255  # bytes in one path component, on every local filesystem we run on
PATH_MAX = 4095  # bytes in a whole path, as the kernel takes it


def path_problems(spec: ExperimentSpec) -> list[str]:
    """Local paths no filesystem can hold: a component over NAME_MAX bytes or a path over
    PATH_MAX. Found here, every later command (check, plan, run) would fail on them with an
    operating-system error instead."""
    problems = []
    for field, path in local_paths(spec):
        size = len(path.encode("utf-8"))
        longest = max((len(part.encode("utf-8")) for part in path.split("/")), default=0)
        if longest > NAME_MAX:
            problems.append(f"{field}: a path component of {longest} bytes; filesystems hold "
                            f"at most {NAME_MAX}")
        elif size > PATH_MAX:
            problems.append(f"{field}: a path of {size} bytes; the system takes at most "
                            f"{PATH_MAX}")
    return problems


def _refuse(source: str, problems: list[str]) -> InvalidInput:
    """Every problem in the details (``--json``), a bounded line of them for the terminal."""
    return InvalidInput(f"{source}: {len(problems)} problem(s): " + problems_text(problems),
                        details={"problems": problems})


def parse_spec(doc: Any, *, source: str = "spec", stored: bool = False) -> ExperimentSpec:
    """``stored``: the spec a plan carries, read back as it was accepted then (a check added
    since, such as select_by's metric names, does not turn an existing run invalid)."""
    if not isinstance(doc, dict):
        raise InvalidInput(f"{source}: a spec is a JSON object, got {type(doc).__name__}")
    problems = carriable_problems(doc) or secret_problems(doc)
    if problems:
        raise _refuse(source, problems)
    try:
        spec = ExperimentSpec.model_validate(doc, context={"stored": stored})
    except ValidationError as exc:
        raise _refuse(source, format_errors(exc)) from None
    problems = path_problems(spec)
    if problems:
        raise _refuse(source, problems)
    return spec


def load_spec(path: str | os.PathLike[str]) -> ExperimentSpec:
    """A spec file, and every file it names that is there proven readable as a file (a
    FIFO or a link to a device would block or never end in whatever reads it next)."""
    spec = parse_spec(read_json(path, what="spec"), source=str(path))
    check_input_files(spec, Path(path).resolve().parent)
    return spec
