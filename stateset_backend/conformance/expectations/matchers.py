"""Values an engine may be given in more than one spelling, where its own code admits several
that mean the same: a switch left off or set false, a bound no run reaches, any size its
assertion accepts, a path inside the run folder, the run's name. Every engine's expectations
use them; each says, in its repr, what it accepts."""

from __future__ import annotations

import re
from typing import Any

from stateset_backend.conformance.expectations.common import MISSING
from stateset_backend.spec.model import ExperimentSpec


# -- values a launch may spell more than one way ---------------------------------------------
class _Matcher:
    """An expected value the engine reads as the same setting in more than one form; the
    kit compares ``read == expected``, which Python hands to this class's ``__eq__``."""

    def __eq__(self, other: object) -> bool:  # pragma: no cover - each subclass has its own
        raise NotImplementedError

    __hash__ = None  # type: ignore[assignment]


class _Off(_Matcher):
    """A switch or optional option left off: argparse's default (absent from the launch,
    ``store_true`` False, an option's None) or an explicit False/None/0."""

    def __eq__(self, other: object) -> bool:
        return other is MISSING or other is None or other is False or \
            (isinstance(other, int | float) and not isinstance(other, bool) and other == 0)

    def __repr__(self) -> str:
        return "<off: absent, False, None or 0>"


OFF = _Off()


class AtLeast(_Matcher):
    """A bound no run reaches (the engine has no "unbounded" value: argparse takes a float)."""

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = float(other)
            except ValueError:
                return False
        return isinstance(other, int | float) and not isinstance(other, bool) and \
            other >= self.bound

    def __repr__(self) -> str:
        return f"<at least {self.bound:g}>"


class AtMost(AtLeast):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, int | float) and not isinstance(other, bool) and \
            other <= self.bound

    def __repr__(self) -> str:
        return f"<at most {self.bound:g}>"


class Satisfies(_Matcher):
    """The values the engine's own code admits (the condition is the engine's, quoted in
    ``text``): any of several for a knob that does not change the math, or the one a count
    needs (``equal_split``), none at all when nothing meets it."""

    def __init__(self, test: Any, text: str) -> None:
        self.test, self.text = test, text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and not isinstance(other, bool) and bool(self.test(other))

    def __repr__(self) -> str:
        return f"<{self.text}>"


def equal_split(total: int, count: int, unit: str) -> Satisfies:
    """The size of each of ``count`` equal parts of ``total`` ``unit``: engines split a batch
    into chunks of a given size, a remainder one more and smaller, so only that size gives
    ``count`` equal optimizer steps; where none does, the release must refuse the spec."""
    return Satisfies(lambda m: m * count == total, f"m with {count} x m == {total} {unit}")


# a clip range no reward, value or ratio of a run reaches: the engine clips nothing
UNBOUNDED = 1e9


class SplitPath(_Matcher):
    """The spec's own data file: its uri, resolved against the spec's folder (the plan hands
    the engine an absolute path)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str):
            return False
        uri = self.uri.removeprefix("./")
        return other == self.uri or (not uri.startswith("/") and other.endswith("/" + uri))

    def __repr__(self) -> str:
        return f"<the file {self.uri!r}>"


class InRunDir(_Matcher):
    """A path inside the attempt's run folder (``{run_dir}``, filled in at launch): the engine
    writes (or the hub's launcher prepares) it there, never in the engine's working
    directory, where another run's files would mix with this one's."""

    def __init__(self, name: str = "", suffix: str = "") -> None:
        self.name, self.suffix = name, suffix

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith("{run_dir}/") and \
            (not self.name or other == "{run_dir}/" + self.name) and other.endswith(self.suffix)

    def __repr__(self) -> str:
        return f"<{{run_dir}}/{self.name or '...'}{self.suffix}>"


RUN_ID = re.compile(r"^(<run-id>|[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8})$")


class RunName(_Matcher):
    """The run's name: ``<run id>.<experiment digest>`` (the hub finds a run's logs by it and
    tells them from another run's); the run id is the plan's own (``<run-id>`` once
    normalised)."""

    def __init__(self, spec: ExperimentSpec, sep: str = ".") -> None:
        from stateset_backend.spec.digest import experiment_digest

        self.digest = experiment_digest(spec).removeprefix("sha256:")
        self.sep = sep

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str) or self.sep not in other:
            return False
        run, _, digest = other.rpartition(self.sep)
        return bool(RUN_ID.match(run)) and digest in (self.digest, "<digest>")

    def __repr__(self) -> str:
        return f"<run-id>{self.sep}{self.digest}"


# -- the spec's facts in OpenRLHF's units ----------------------------------------------------
