"""What the built-in engines must read for the spec's most error-prone settings, written from
the engines' own documentation and code, never from an adapter.

The kit's other checks hold an adapter to its own translation; these hold it to the engine:
a swapped clip pair, a mini-batch counted in responses instead of prompts, a response limit
that includes the prompt or an estimator mapped to the wrong name passes every check that only
compares an adapter with itself. Each entry: the option's spellings across releases (the first
the release's surface has is the one), and the value (or the values, where the engine accepts
aliases) it must read for a spec. Settings a spec makes moot return None (not checked).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stateset_backend.conformance.expectations.common import Expect, OneOf
from stateset_backend.conformance.expectations.nemo_rl import NEMO_RL
from stateset_backend.conformance.expectations.openrlhf import OPENRLHF
from stateset_backend.conformance.expectations.trl import TRL
from stateset_backend.conformance.expectations.verl import VERL
from stateset_backend.engines.adapter import EngineAdapter
from stateset_backend.spec.model import ExperimentSpec

__all__ = ["BUILTIN", "Expect", "OneOf", "expectations_of", "expected", "idle", "unexpected"]

BUILTIN = {"verl": VERL, "openrlhf": OPENRLHF, "nemo-rl": NEMO_RL, "trl": TRL}


def expectations_of(adapter: EngineAdapter) -> list[tuple[tuple[str, ...], Expect]]:
    """The kit's own expectations of a built-in engine; a plugin's ``kit_support()``."""
    return BUILTIN.get(adapter.name) or list(adapter.kit_support().expectations)


def expected(adapter: EngineAdapter, spec: ExperimentSpec, surface: dict[str, Any] | None,
             read: Iterable[str] = ()) -> dict[str, Any]:
    """{engine key: the value (or OneOf values) the engine must read} for this spec: under
    the first spelling the release's surface has, else (a key the launch adds with Hydra's
    ``+``, one inside a free mapping) the spelling the engine was found reading (``read``)."""
    options = (surface or {}).get("options", {})
    found = set(read)
    out: dict[str, Any] = {}
    for spellings, expect in expectations_of(adapter):
        key = next((k for k in spellings if k in options), None) if options else spellings[0]
        if key is None:
            key = next((k for k in spellings if k in found), None)
        value = expect(spec)
        if key is not None and value is not None:
            out[key] = value
    return out


def unexpected(adapter: EngineAdapter, keys: Iterable[str]) -> list[str]:
    """The keys (dotted, as a launch declares them) no expectation names, in any release's
    spelling; a mapping's expectation covers the keys below it."""
    covered = {k for spellings, _ in expectations_of(adapter) for k in spellings}
    return sorted(k for k in keys if k not in covered
                  and not any(k.startswith(c + ".") for c in covered))


def idle(adapter: EngineAdapter, keys: Iterable[str], specs: Iterable[ExperimentSpec]) -> \
        str | None:
    """Why nothing is held, when the expectations of every key the launches set (``keys``)
    give no value for any of ``specs``: each says "not checked" for every sample, so the
    values the launch gives are held to nothing (expectations that always answer None would
    certify a swapped key). An expectation returns None only where a spec makes its key
    moot, so one such key among others is no finding. None when something is held."""
    specs = list(specs)
    named = set(keys) - set(unexpected(adapter, keys))
    held = {k for spellings, expect in expectations_of(adapter)
            if any(expect(spec) is not None for spec in specs) for k in spellings}
    if not named or any(k in held or any(k.startswith(c + ".") for c in held)
                        for k in named):
        return None
    return (f"the expectations of all {len(named)} keys the launches set give no value for "
            f"any of the kit's {len(specs)} samples: nothing the engine reads is held to a "
            "value (an expectation returns None only where the spec makes its key moot)")
