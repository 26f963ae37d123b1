"""What every engine's expectations share: the type of an expectation, values an engine
accepts as one, and the spec's own facts they are written with."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from typing import Any

from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.shared_rules import total_limit, turn_limit

Expect = Callable[[ExperimentSpec], Any]


class OneOf(tuple[Any, ...]):
    """Values the engine accepts as the same setting (verl's KL estimator aliases)."""


def single_turn(spec: ExperimentSpec) -> bool:
    return spec.environment.kind == "single_turn"


def sequence_tokens(spec: ExperimentSpec) -> int:
    """A whole sequence's tokens, as the spec limits it: prompt and response, or a whole
    conversation (docs/environments.md)."""
    if single_turn(spec):
        return spec.data.max_total_tokens or \
            spec.data.max_prompt_tokens + spec.data.max_response_tokens
    return total_limit(spec)


def response_tokens(spec: ExperimentSpec) -> int:
    """One response's (one assistant turn's) token limit."""
    return spec.data.max_response_tokens if single_turn(spec) else turn_limit(spec)


def kl_at(spec: ExperimentSpec, placement: str) -> Any:
    kl = spec.algorithm.kl
    return kl if kl is not None and kl.placement == placement else None


def rl(expect: Expect) -> Expect:
    """An expectation of an RL launch; an sft spec runs another trainer (not checked)."""
    return lambda s: None if s.algorithm.objective == "sft" else expect(s)


def sft(expect: Expect) -> Expect:
    return lambda s: expect(s) if s.algorithm.objective == "sft" else None


class Matching:
    """A string of a known shape the spec alone cannot fix (a plan's run id, the spec's folder
    a relative path resolves against): equal to a string its pattern matches in full."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and re.fullmatch(self.pattern, other) is not None

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"Matching({self.pattern!r})"


# a key the engine was not found reading at all (the reader returned no value for it)
MISSING = object()


class _Unset:
    """A key the launch leaves out, where the release's own default is the value (or the key
    is moot in that release): in a ``OneOf`` beside the value a launch that sets it must give."""

    def __eq__(self, other: object) -> bool:
        return other is MISSING

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


def resolved_path(uri: str) -> Matching:
    """A spec's local path as an engine gets it: absolute as written, else resolved against
    the spec's folder (any absolute folder, ending in the path as written)."""
    path = posixpath.normpath(uri)
    return Matching(re.escape(path) if path.startswith("/") else "/.*/" + re.escape(path))


class AtLeast:
    """Any number from ``bound`` up (inf included): the values an engine reads alike, where
    its own code bounds what the setting is compared with (verl's dual-clip constant above
    the largest ratio its clamp allows never binds)."""

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int | float) and not isinstance(other, bool) and \
            other >= self.bound

    def __hash__(self) -> int:
        return hash(self.bound)

    def __repr__(self) -> str:
        return f"AtLeast({self.bound!r})"
