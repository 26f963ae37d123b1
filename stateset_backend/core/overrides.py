"""Rendering native values as Hydra/OmegaConf ``key=value`` command-line overrides.

verl and NeMo RL both take their configuration as such overrides; one renderer keeps their
quoting identical and correct (a string that looks like a number or holds a comma must be
quoted, or Hydra parses it into something else).
"""

from __future__ import annotations

import json
import re
from typing import Any

_BARE = re.compile(r"^[A-Za-z_/~.][A-Za-z0-9_./~:@+-]*$")
_RESERVED = {"true", "false", "null", "none", "nan", "inf", "-inf"}


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
        return "{" + ",".join(f"{k}:{value(x)}" for k, x in v.items()) + "}"
    text = str(v)
    if _BARE.match(text) and text.lower() not in _RESERVED:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def render(native: dict[str, Any]) -> list[str]:
    """``key=value`` for every native key, in a stable order."""
    return [f"{key}={value(v)}" for key, v in sorted(native.items())]
