"""Reading a spec from disk into an ExperimentSpec, with every problem as ``path.to.field: msg``.

A user fixing a spec wants all problems at once, each pointing at the field, and a hint when
an unknown key is a near-miss of a real one (``grup_size`` → ``group_size``).
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import InvalidInput
from .jsonio import read_json
from .modeltree import model_in
from .spec import ExperimentSpec


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
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = _fields_at(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            msg = "unknown key" + (f"; did you mean '{close[0]}'?" if close else "")
        line = f"{_dotted(loc)}: {msg}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def parse_spec(doc: Any, *, source: str = "spec") -> ExperimentSpec:
    if not isinstance(doc, dict):
        raise InvalidInput(f"{source}: a spec is a JSON object, got {type(doc).__name__}")
    try:
        return ExperimentSpec.model_validate(doc)
    except ValidationError as exc:
        problems = format_errors(exc)
        raise InvalidInput(
            f"{source}: {len(problems)} problem(s): " + "; ".join(problems),
            details={"problems": problems},
        ) from None


def load_spec(path: str | os.PathLike[str]) -> ExperimentSpec:
    return parse_spec(read_json(path, what="spec"), source=str(path))
