"""The import paths of the flat ``core`` package, kept for one release.

The modules moved into one folder per pipeline stage (docs/layout.md). Code outside the package
that imported ``stateset_backend.core.<module>`` keeps working: the old name is the new module
itself (same objects, so ``isinstance`` and monkeypatching agree), with a DeprecationWarning
naming the new path. Plugins should import only ``stateset_backend.plugin``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

MOVED = {
    "adapter": "engines.adapter", "attest": "publish.attest",
    "capabilities": "contracts.capabilities", "content": "spec.content",
    "contracts": "contracts.loader", "digest": "spec.digest", "display": "common.display",
    "effective": "translate.effective", "errors": "common.errors",
    "evaluate": "runs.evaluate", "evaluations": "runs.evaluations",
    "export": "publish.export", "history": "runs.history", "hookspecs": "engines.hookspecs",
    "hub": "translate.hub", "inputs": "spec.inputs", "jsonio": "common.jsonio",
    "launch": "providers.local", "lineage": "runs.lineage", "modeltree": "spec.modeltree",
    "overrides": "translate.overrides", "plan": "plan.launch_plan",
    "providers": "providers.base", "quarantine": "runs.quarantine",
    "ray_jobs": "providers.ray_jobs", "registry": "engines.registry",
    "report": "publish.report", "results": "runs.results", "rules": "translate.rules",
    "runner": "runs.runner", "runs": "runs.views", "runtime": "runs.runtime",
    "schemas": "publish.schemas", "shared_rules": "translate.shared_rules",
    "spec": "spec.model", "specfile": "spec.files", "store": "runs.store",
    "surfaces": "contracts.surfaces", "tensorboard": "runs.tensorboard",
    "verify": "runs.verify",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``stateset_backend.core.<old>`` to the module at its new path."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        head, _, name = fullname.rpartition(".")
        if head != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        new = f"stateset_backend.{MOVED[spec.name.rpartition('.')[2]]}"
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The new module is already executed."""


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.append(_Alias())
