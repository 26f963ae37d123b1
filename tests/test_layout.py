"""The package's layout keeps reading as the pipeline (docs/layout.md).

The import rules live in pyproject.toml as import-linter contracts (stages import only earlier
stages, adapters are independent, the kit never imports an adapter, no import cycle); this
module runs them and adds what import-linter does not know: every folder is placed in a stage,
and modules and folders stay small enough to read.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

importlinter_cli = pytest.importorskip(
    "importlinter.cli", reason="import-linter is missing: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stateset_backend"
# Folders that hold no pipeline code: JSON Schemas (data), and the old flat `core` import
# paths kept for one release (an import hook that resolves them to the new modules).
NOT_STAGES = {"schemas", "core"}
# Declarative tables or one algorithm's whole loop, allowed past the module limit.
LONG_MODULES = {"spec/model.py", "native/trainer.py"}
MODULE_LINES, CLI_LINES, FOLDER_MODULES = 500, 250, 20


def _contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["importlinter"]["contracts"]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_import_contracts_hold(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = importlinter_cli.lint_imports(no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert code == 0, report
    assert f"{len(_contracts())} kept, 0 broken" in report, report


def test_every_folder_and_module_is_in_a_stage():
    stages = next(c for c in _contracts() if c["id"] == "stages")["layers"]
    named = {layer.removeprefix("stateset_backend.") for layer in stages}
    found = {p.stem for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists())
             or (p.suffix == ".py" and not p.name.startswith("__"))}
    assert sorted(found - named - NOT_STAGES) == []


def test_modules_are_small_enough_to_read():
    modules = {p.relative_to(PACKAGE).as_posix(): _lines(p) for p in PACKAGE.rglob("*.py")}
    long = {m: n for m, n in modules.items() if n > MODULE_LINES and m not in LONG_MODULES}
    assert long == {}
    cli = {m: n for m, n in modules.items() if m.startswith("cli/") and n > CLI_LINES}
    assert cli == {}


def test_no_folder_holds_more_than_twenty_modules():
    crowded = {}
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]:
        count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
        if count > FOLDER_MODULES:
            crowded[folder.relative_to(ROOT).as_posix()] = count
    assert crowded == {}
