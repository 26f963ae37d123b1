"""One adapter class run through the conformance kit as an author's own test module would run
it: the module written from a template naming the class, pytest run on a selection of checks."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from stateset_backend.conformance.runner import run_module

HERE = Path(__file__).resolve().parent


def run_kit(tmp_path: Path, template: str, cls: type, node: str,
            selection: str) -> dict[str, Any]:
    """The kit's report for ``template`` (a test module with ``{cls}`` in it) with ``cls``."""
    text = template.format(cls=cls.__name__)
    # named by its text too: pytest keeps an imported test module by name, so two templates
    # for one class must not share one
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    module = tmp_path / f"test_kit_{cls.__name__.lower()}_{digest}.py"
    module.write_text(text, encoding="utf-8")
    return run_module(module, node, ["-k", selection, "--import-mode=importlib",
                                     "-o", f"pythonpath={HERE}"])
