"""Plugins, ours included, import only from the public API ``stateset_backend.plugin``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stateset_backend.plugin as plugin

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = [*sorted((ROOT / "stateset_backend" / "adapters").glob("*.py")),
           *sorted((ROOT / "examples" / "plugins").glob("*/*/*.py"))]
# The native engine's own adapter may also reach into the native engine it launches (its
# output layout).
ENGINE_OWN = {"stateset_backend/adapters/native.py": ("..native",)}


def _internal_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            absolute = module.startswith("stateset_backend.") and \
                module != "stateset_backend.plugin"
            relative = node.level == 2 and module not in ("..plugin",) and not any(
                module.startswith(p) for p in ENGINE_OWN.get(
                    str(path.relative_to(ROOT)), ()))
            if absolute or relative:
                found.append(module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("stateset_backend.")
                      and a.name != "stateset_backend.plugin"]
    return found


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_the_public_api(path):
    assert _internal_imports(path) == []


def test_every_public_name_exists():
    missing = [name for name in plugin.__all__ if not hasattr(plugin, name)]
    assert missing == []
