"""Golden specs for the engine tests: one realistic base per engine, varied per objective."""

from __future__ import annotations

import copy
from typing import Any


def variant(base: dict[str, Any], algorithm: dict[str, Any], *,
            algorithm_defaults: dict[str, Any] | None = None, **model: Any) -> dict[str, Any]:
    """``base`` with its algorithm replaced (over ``algorithm_defaults``) and model updated."""
    doc = copy.deepcopy(base)
    doc["algorithm"] = {**(algorithm_defaults or {}), **algorithm}
    doc["model"].update(model)
    return doc
