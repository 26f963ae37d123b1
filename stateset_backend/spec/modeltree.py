"""Walking the spec's model tree: the leaves a spec has, and the leaves any spec can have.

Explain, translation, the conformance kit and the identity tests all need the same notion of
"a leaf of the spec"; it is defined once, here.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model class inside an annotation such as ``KL | None``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = model_in(arg)
            if found is not None:
                return found
    return None


def _optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def leaves(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a spec as (dotted path, value); an unset optional section is a leaf."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        path = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            yield from leaves(value, path + ".")
        elif isinstance(value, list):
            yield path, list(value)
        elif isinstance(value, dict):
            yield path, dict(value)
        else:
            yield path, value


def all_leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every leaf path any spec can have, including each optional section's own path."""
    paths: list[str] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = model_in(info.annotation)
        if sub is None or _optional(info.annotation):
            paths.append(path)
        if sub is not None:
            paths.extend(all_leaf_paths(sub, path + "."))
    return paths
