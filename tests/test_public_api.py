"""Plugins, ours included, import only from the public API ``stateset_backend.plugin``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stateset_backend.plugin as plugin

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ROOT / "stateset_backend" / "adapters"
PLUGINS = [*sorted(ADAPTERS.rglob("*.py")),
           *sorted((ROOT / "examples" / "plugins").glob("*/*/*.py"))]
# An adapter package may use its own modules and the shims every adapter shares; the native
# engine's own adapter may also reach into the native engine it launches (its output layout).
SHARED = ("stateset_backend.plugin", "stateset_backend.adapters.agent_shims")
ENGINE_OWN = {"native": ("stateset_backend.native",)}


def _allowed(path: Path) -> tuple[str, ...]:
    if not path.is_relative_to(ADAPTERS):
        return SHARED[:1]
    inside = path.relative_to(ADAPTERS).parts
    if len(inside) == 1:  # adapters/__init__.py registers the built-in adapters
        return ("stateset_backend.plugin", "stateset_backend.adapters")
    own = f"stateset_backend.adapters.{inside[0]}"
    return (*SHARED, own, *ENGINE_OWN.get(inside[0], ()))


def _internal_imports(path: Path) -> list[str]:
    allowed = _allowed(path)

    def internal(module: str) -> bool:
        return module.startswith("stateset_backend") and not any(
            module == a or module.startswith(a + ".") for a in allowed)

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level > 1:  # out of its own package: say it in full
                found.append("." * node.level + (node.module or ""))
            elif not node.level and internal(node.module or ""):
                found.append(node.module or "")
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if internal(a.name)]
    return found


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_the_public_api(path):
    assert _internal_imports(path) == []


def test_every_public_name_exists():
    missing = [name for name in plugin.__all__ if not hasattr(plugin, name)]
    assert missing == []
