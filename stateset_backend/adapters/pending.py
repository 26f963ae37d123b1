"""Engines whose contract is known but whose translation is not written yet.

They are listed by ``engines`` and answer ``check`` from their contract, so a user can learn
which versions could run a spec; ``plan`` and ``run`` refuse them with exit 3 rather than
launch something whose fields nobody mapped.
"""

from __future__ import annotations

from functools import cached_property

from ..core.adapter import EngineAdapter, LaunchContext, NativeLaunch
from ..core.contracts import Contract, Dialect, load_packaged_contract
from ..core.errors import Unsupported
from ..core.rules import RuleSet, Translation, reject
from ..core.spec import ExperimentSpec


class PendingAdapter(EngineAdapter):
    def __init__(self, engine: str) -> None:
        self.name = engine

    @cached_property
    def contract(self) -> Contract:
        return load_packaged_contract("stateset_backend.contracts", f"{self.name}.json")

    def rules(self, dialect: Dialect) -> RuleSet:
        pending = reject(f"the {self.name} translation is not available in this release")
        return {section: pending for section in ExperimentSpec.model_fields}

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        raise Unsupported(f"the {self.name} translation is not available in this release")
