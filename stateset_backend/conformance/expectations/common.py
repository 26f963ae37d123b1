"""What every engine's expectations share: the type of an expectation, values an engine
accepts as one, and the spec's own facts they are written with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stateset_backend.spec.model import ExperimentSpec

Expect = Callable[[ExperimentSpec], Any]


class OneOf(tuple[Any, ...]):
    """Values the engine accepts as the same setting (verl's KL estimator aliases)."""


def single_turn(spec: ExperimentSpec) -> bool:
    return spec.environment.kind == "single_turn"


def kl_at(spec: ExperimentSpec, placement: str) -> Any:
    kl = spec.algorithm.kl
    return kl if kl is not None and kl.placement == placement else None


def rl(expect: Expect) -> Expect:
    """An expectation of an RL launch; an sft spec runs another trainer (not checked)."""
    return lambda s: None if s.algorithm.objective == "sft" else expect(s)


def sft(expect: Expect) -> Expect:
    return lambda s: expect(s) if s.algorithm.objective == "sft" else None
