"""Execution defaults: the keys a launch sets only for memory, speed or placement, which
``engine_options`` may change.

Everything else a launch sets (identity, outputs, a spec setting, a fixed switch that changes
the math) is guarded: no ``engine_options`` entry may reach it. An execution default is
declared, for each release, in the contract's dialect under ``keys.execution``, each with the
reason its value cannot change the experiment's math, so the reader of the contract sees the
whole list and its argument in one place. A key whose value changes the math on some values
names the values that do not (``{"reason": ..., "values": [...]}``). The binding digest
records ``engine_options``, so two runs that differ only in an execution default are one
experiment, launched two ways.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stateset_backend.common.errors import AdapterBug, InvalidInput

EXECUTION = "execution"  # the dialect slot that declares them


@dataclass(frozen=True)
class ExecutionDefault:
    reason: str
    values: tuple[Any, ...] | None = None  # None: every value the engine's parser takes
    # other keys that must hold one of their listed values wherever this one leaves the
    # launch's own value, and why (OpenRLHF's dynamic batching sums its micro-batches' gradients
    # only under ZeRO-3)
    requires: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    requires_why: str = ""


def execution_defaults(dialect: Any) -> dict[str, ExecutionDefault]:
    """The execution defaults a dialect declares (none where it declares none)."""
    raw = dialect.keys.get(EXECUTION) or {}
    if not isinstance(raw, dict):
        raise AdapterBug(f"dialect {dialect.name!r}: keys.{EXECUTION} maps native keys to the "
                         "reason each cannot change the math")
    out: dict[str, ExecutionDefault] = {}
    for key, entry in raw.items():
        entry = entry if isinstance(entry, dict) else {"reason": entry}
        reason, values = entry.get("reason"), entry.get("values")
        requires, why = entry.get("requires") or {}, entry.get("requires_why", "")
        if not isinstance(reason, str) or not reason.strip() or \
                not (values is None or (isinstance(values, list) and values)) or \
                not isinstance(requires, dict) or \
                not all(isinstance(v, list) and v for v in requires.values()) or \
                bool(requires) != (isinstance(why, str) and bool(why.strip())):
            raise AdapterBug(f"dialect {dialect.name!r}: keys.{EXECUTION}.{key}: a reason (a "
                             "non-empty string) and, optionally, a non-empty list of values "
                             "and the values other keys must hold (requires, each a non-empty "
                             "list) with why (requires_why)")
        out[key] = ExecutionDefault(reason, None if values is None else tuple(values),
                                    tuple((k, tuple(v)) for k, v in requires.items()), why)
    return out


def unmet(options: dict[str, Any], own: dict[str, Any],
          execution: dict[str, ExecutionDefault],
          defaults: dict[str, Any] | None = None) -> str | None:
    """The first requirement of an execution default the options leave unmet, as the line
    that refuses it; None when every one is met. A requirement holds wherever the engine reads
    the default at another value than the launch's own (``own``: the launch without the
    options), judged on what the engine reads: the options given by the exact key or by a
    mapping above it, over the launch's own values, over the release's ``defaults`` (its
    configuration surface's: verl 0.6.1 defaults to padded rows, 0.9.1 to padding-free)."""
    for key, declared in execution.items():
        value = _effective(key, options, own)
        if not declared.requires or value == _read(key, own):
            continue
        for need, allowed in declared.requires:
            have = _effective(need, options, own, _MISSING)
            if have is _MISSING and defaults is not None and need in defaults:
                have = defaults[need]
                now = f"it is {have!r}, the release's default"
            elif have is _MISSING:
                now = "the launch leaves it at the release's default"
            else:
                now = f"it is {have!r}"
            if have not in allowed:
                return (f"{key}: {value!r} needs {need} to be "
                        f"{' or '.join(map(repr, allowed))} ({now}): "
                        f"{declared.requires_why}")
    return None


def _effective(path: str, options: dict[str, Any], own: dict[str, Any],
               missing: Any = None) -> Any:
    """What the engine reads at ``path``: an option naming it, or a mapping option above it
    that sets it, else the launch's own value, found the same ways; ``missing`` where
    neither sets it (the engine then reads its release's default)."""
    found = _read(path, options, _MISSING)
    return _read(path, own, missing) if found is _MISSING else found


_MISSING = object()


def _read(path: str, values: dict[str, Any], missing: Any = None) -> Any:
    """The value ``values`` gives ``path``: under its key in any spelling (``++key``, as a
    Hydra launch force-adds it) or inside a mapping given above it; ``missing`` where none
    does."""
    for key, value in values.items():
        bare = _bare(key)
        if bare == path:
            return value
        if isinstance(value, dict) and path.startswith(bare + "."):
            node: Any = value
            for part in path[len(bare) + 1:].split("."):
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                return node
    return missing


def _bare(key: str) -> str:
    return key.lstrip("~+").split("=", 1)[0]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + ".")


def _covered(path: str, value: Any, execution: dict[str, ExecutionDefault]) -> bool:
    """Every leaf a Hydra-style mapping value sets at ``path`` lies inside a declared
    execution default, at one of its declared values where it names them (a key inside a
    default limited to values is none of them)."""
    for name, declared in execution.items():
        if path == name:
            return declared.values is None or value in declared.values
        if _within(path, name):
            return declared.values is None
    if isinstance(value, dict) and value and any(e.startswith(path + ".") for e in execution):
        return all(_covered(f"{path}.{k}", v, execution) for k, v in value.items())
    return False


def reached(key: str, value: Any, taken: Any, execution: dict[str, ExecutionDefault],
            conflict: Callable[[str, Any], str | None]) -> str | None:
    """The guarded key in ``taken`` an ``engine_options`` entry would delete, add over,
    override or shadow, or None where it reaches only declared execution defaults.

    An entry may name an execution default exactly (an abbreviated flag never passes), a key
    inside one, or a mapping the launch sets whole (or a key inside it) where every leaf it
    sets lies inside a declared default: Hydra merges a mapping into a mapping, and the launch
    merges its own value under the user's (``merged``). A value outside the declared values
    is refused here, naming them. ``conflict`` is the rule kit's ``option_conflict``: every
    spelling that reaches a key."""
    bare = _bare(key)
    hydra = not bare.startswith("-") and not key.startswith("~")
    exact = execution.get(bare)
    if exact is not None and exact.values is not None and value not in exact.values:
        # where the launch leaves the key at the release's default, as where it sets it
        raise _outside(key, value, exact)
    for other in taken:
        if conflict(key, [other]) is None:
            continue
        theirs = _bare(str(other))
        declared = execution.get(theirs)
        if declared is not None and (bare == theirs or (hydra and _within(bare, theirs))):
            if declared.values is not None and bare != theirs:  # inside a limited default
                raise _outside(key, value, declared)
            if bare == theirs and isinstance(taken, dict):
                _same_kind(key, value, taken[other])
            continue
        if hydra and _within(bare, theirs) and _covered(bare, value, execution):
            continue  # inside a mapping the launch sets whole, only where it is declared
        return str(other)
    return None


def _outside(key: str, value: Any, declared: ExecutionDefault) -> InvalidInput:
    return InvalidInput(f"{key}: {value!r} is not one of the values that leave the math "
                        f"unchanged ({', '.join(map(repr, declared.values or ()))})")


def declared_inside(taken: str, execution: dict[str, ExecutionDefault]) -> list[str]:
    """The execution defaults declared inside a mapping the launch holds (verl's model config
    overrides, vLLM's engine arguments): the only keys an option may give there."""
    root = _bare(taken)
    return sorted(e for e in execution if e.startswith(root + "."))


def _same_kind(key: str, value: Any, own: Any) -> None:
    """An execution default is a knob of one kind: a switch stays a switch, and a count or
    size the launch sets to at least one stays a whole number of at least one (a micro-batch
    of 0 plans here and stops the engine at start-up)."""
    if isinstance(own, bool):
        if not isinstance(value, bool):
            raise InvalidInput(f"{key}: {value!r}: a switch (true or false)")
    elif isinstance(own, int) and own >= 1 and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidInput(f"{key}: {value!r}: a whole number of at least 1")


def merged(own: Any, option: Any) -> Any:
    """What the engine reads where an option's mapping merges into the launch's own."""
    if isinstance(own, dict) and isinstance(option, dict):
        out = dict(own)
        for k, v in option.items():
            out[k] = merged(own.get(k), v)
        return out
    return option
