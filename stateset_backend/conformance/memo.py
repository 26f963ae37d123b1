"""What the kit's checks share: the base fitted to a release, a capability's sample, every
spec a check plans, the launches read back, what fresh interpreters made of the samples.
Every check of a class starts from the same samples and many plan the same specs, so each is
planned and read once per set of sample files, not once per check.

A result is keyed on everything it is a function of: the adapter (its class when the instance
holds no state of its own, else the instance itself), the release, the sample files, and the
validated spec, documents or overrides as their ``repr`` (which tells ``1`` from ``1.0`` and
``True``); a read also on the environment and working folder the reader sees (an
interpolation may read a variable). An adapter plans and reads as a function of these alone,
which the determinism checks prove on plans of their own, never on remembered ones. Callers
copy what they may change; plans are frozen.

Results live as long as their sample files: a test class forgets them when its files go, and
at most a few sets are kept for callers that never say (the matrix, one-off probes).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stateset_backend.conformance.samples import SampleFiles
from stateset_backend.engines.adapter import EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan

T = TypeVar("T")
KEPT_FILE_SETS = 4


class Same:
    """A key that matches only the very object it holds, and keeps that object alive so no
    later object can take over its id."""

    __slots__ = ("held",)

    def __init__(self, held: object) -> None:
        self.held = held

    def __hash__(self) -> int:
        return id(self.held)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.held is self.held


def adapter_key(adapter: EngineAdapter) -> Hashable:
    """Instances of a class without state of their own plan alike; any other instance is only
    itself."""
    try:
        stateless = not vars(adapter)
    except TypeError:  # __slots__: state the kit cannot see
        stateless = False
    return type(adapter) if stateless else Same(adapter)


def files_key(files: SampleFiles) -> Hashable:
    return str(files.root), files.data_format, tuple(sorted(files.sha256.items()))


@dataclass
class _FileSet:
    results: dict[Hashable, tuple[bool, Any]] = field(default_factory=dict)
    plans: dict[int, LaunchPlan] = field(default_factory=dict)  # launches checks share
    reads: dict[Hashable, dict[str, Any]] = field(default_factory=dict)


_SETS: OrderedDict[Hashable, _FileSet] = OrderedDict()


def _set_of(files: SampleFiles) -> _FileSet:
    key = files_key(files)
    found = _SETS.get(key)
    if found is None:
        found = _SETS[key] = _FileSet()
        while len(_SETS) > KEPT_FILE_SETS:
            _SETS.popitem(last=False)
    _SETS.move_to_end(key)
    return found


def once(files: SampleFiles, key: Hashable, compute: Callable[[], T],
         remembered: tuple[type[Exception], ...] = ()) -> T:
    """``compute()`` the first time ``key`` is asked for with these files, its result (or
    failure of a ``remembered`` type, raised again with the same message) after that. A
    launch in the result is shared: reading it back is remembered too."""
    entries = _set_of(files)
    if key not in entries.results:
        try:
            entries.results[key] = (True, compute())
        except remembered as exc:  # its kind and words, not its frames
            entries.results[key] = (False, (type(exc), exc.args))
    ok, value = entries.results[key]
    if not ok:
        kind, args = value
        raise kind(*args) from None
    for item in value if isinstance(value, tuple) else (value,):
        if isinstance(item, LaunchPlan):
            entries.plans[id(item)] = item
    return value


def read_once(reader: Hashable, read: Callable[[LaunchPlan], dict[str, Any]],
              plan: LaunchPlan) -> dict[str, Any] | None:
    """A shared launch as ``read`` (which ``reader`` names) reads it, remembered; None when
    the launch is not shared (read it afresh)."""
    for entries in _SETS.values():
        if entries.plans.get(id(plan)) is plan:
            key = (reader, id(plan), os.getcwd(), _environment())
            if key not in entries.reads:
                entries.reads[key] = read(plan)
            return entries.reads[key]
    return None


def _environment() -> frozenset[tuple[str, str]]:
    """The variables a reader could see, less the one pytest sets to name the running test."""
    return frozenset(item for item in os.environ.items() if item[0] != "PYTEST_CURRENT_TEST")


def forget(files: SampleFiles) -> None:
    """Drop what was remembered for these files (their test class is done)."""
    _SETS.pop(files_key(files), None)
