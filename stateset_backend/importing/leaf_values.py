"""The values a spec leaf's type admits, and a launch's value read as that type: what the
import's solver proposes for each leaf (its literal choices, a neutral start for a section
switched on, a launch number in the units other leaves convert it by)."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ValidationError

from stateset_backend.common.jsonio import flatten
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.modeltree import model_in


def annotation_at(path: str) -> Any:
    model: type[BaseModel] | None = ExperimentSpec
    annotation: Any = None
    for part in path.split("."):
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = model_in(annotation)
    return annotation


def unwrap(annotation: Any) -> list[Any]:
    """The plain types an annotation admits (Optional, Annotated and unions opened)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in unwrap(arg)]
    return [annotation]


def choices(annotation: Any) -> list[Any]:
    out: list[Any] = []
    for t in unwrap(annotation):
        if typing.get_origin(t) is typing.Literal:
            out.extend(typing.get_args(t))
        elif t is bool:
            out.extend([True, False])
        elif t is type(None):
            out.append(None)
    return out


def kinds_of(annotation: Any) -> set[Any]:
    return {typing.get_origin(t) or t for t in unwrap(annotation)}


def converted(raw: Any, kinds: set[Any], numbers: list[Any],
               summands: list[int]) -> Iterator[Any]:
    """The launch's value as the leaf's type, and in the units other leaves convert it by."""
    if isinstance(raw, bool):
        if bool in kinds:
            yield raw
        return
    if isinstance(raw, int | float):
        values = [raw]
        for n in numbers:
            values += [raw * n, raw / n, n / raw if raw else 0]
        if raw:  # samples per step over prompts and samples per prompt
            values += [a * b / raw for i, a in enumerate(numbers) for b in numbers[i + 1:]]
        values += [raw - n for n in summands]
        if 0 < raw < 1:  # a fraction of a count (warmup as a ratio of the steps)
            values += [math.ceil(raw * n) for n in numbers] + [round(raw * n) for n in numbers]
        for v in values:
            if int in kinds and float(v).is_integer():
                yield int(v)
            elif float in kinds:
                yield float(v)
        return
    if isinstance(raw, str) and str in kinds:
        yield raw
    elif isinstance(raw, list) and (list in kinds or tuple in kinds):
        yield list(raw)
    elif isinstance(raw, list):  # one key for several leaves (clip low and high as a pair)
        for item in raw:
            yield from converted(item, kinds, [], [])
    elif isinstance(raw, dict):  # a structured value (a scheduler's warmup length inside)
        for item in flatten(raw).values():
            if not isinstance(item, dict):
                yield from converted(item, kinds, [], [])


def neutral(annotation: Any) -> list[Any]:
    """Values a required field of a section can start from before it is solved."""
    kinds = kinds_of(annotation)
    out = choices(annotation)
    if int in kinds:
        out += [1, 2]
    if float in kinds:
        out += [1.0, 0.5, 0.0]
    if str in kinds:
        out.append("")
    return out or [None]


def neutral_section(model: type[BaseModel]) -> dict[str, Any] | None:
    """An optional section switched on, its required fields at a first valid value."""
    doc: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if info.is_required():
            sub = model_in(info.annotation)
            doc[name] = neutral_section(sub) if sub is not None else neutral(info.annotation)
    for name, value in list(doc.items()):
        if isinstance(value, list):
            for item in value:
                try:
                    model.model_validate({**doc, name: item})
                except ValidationError:
                    continue
                doc[name] = item
                break
            else:
                doc[name] = value[0]
    try:
        model.model_validate(doc)
    except ValidationError:
        return None
    return doc
