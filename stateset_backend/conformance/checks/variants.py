"""The values the kit varies a spec setting to: other values of its kind that specs usually
accept (small moves of a number, the other boolean, an enum's other members), values of its
type for one the sample leaves unset, and null where the spec takes it."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.modeltree import model_in


def _annotation(path: str) -> Any:
    """The spec field's type at a dotted leaf path (None where the path leaves the model)."""
    model: Any = ExperimentSpec
    annotation: Any = None
    for part in path.split("."):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return None
        annotation = fields[part].annotation
        model = model_in(annotation)
    return annotation


def nullable(path: str) -> bool:
    """Whether the spec field at ``path`` takes null (its "off" or "none")."""
    annotation = _annotation(path)
    return annotation is not None and type(None) in get_args(annotation)


def _choices(annotation: Any) -> tuple[Any, ...]:
    """The values a Literal-typed (or optional Literal) field allows; empty for other types."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return tuple(v for arg in get_args(annotation) if get_origin(arg) is Literal
                 for v in get_args(arg))


def variants(value: Any, path: str = "") -> list[Any]:
    """Values distinct from ``value`` and each other, of its kind, that specs usually accept
    (tried in order; those the spec or the engine refuses are skipped): small moves of a
    number, the other boolean, the other members of an enum."""
    if isinstance(value, bool):
        return [not value]
    if value is None:
        return _unset_variants(path)
    tries: list[Any]
    if isinstance(value, int):
        tries = [value + 1, value + 2, value * 2, value + 3, value * 4, value - 1]
    elif isinstance(value, float):
        tries = [value * 0.5, value * 0.75, value * 1.25, value + 0.05, value + 0.1] \
            if value else [0.01, 0.02, 0.05]
    elif isinstance(value, str):
        tries = list(_choices(_annotation(path)))
    else:
        return []
    return [v for v in dict.fromkeys(tries) if v != value]


# values to try for a leaf the sample leaves unset (null: "off"), by the field's type: a
# setting no sample turns on is one whose translation nobody checked (a top-k the launch
# always drops, a dual clip replaced by none); counts start within the samples' 4 updates,
# where an interval or a retention still means something
_UNSET = {int: (2, 3, 20, 50), float: (3.0, 5.0, 1.5, 0.5, 0.1)}


def _unset_variants(path: str) -> list[Any]:
    annotation = _annotation(path)
    choices = _choices(annotation)
    if choices:
        return list(choices)
    for arg in get_args(annotation) or (annotation,):
        kind = get_args(arg)[0] if get_origin(arg) is Annotated else arg
        if kind in _UNSET:
            return list(_UNSET[kind])
    return []
