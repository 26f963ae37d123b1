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


def trl_module(module: str, version: str) -> str:
    """A test module of the author's kind for a TRL plugin class defined in ``module``, at
    ``version``, planning the built-in tiny model as the plugin's tests do."""
    return ("\nimport pytest\nfrom stateset_backend.conformance import AdapterConformance\n"
            f"from {module} import {{cls}}\n\n\nclass TestMistake(AdapterConformance):\n"
            f"    engine_versions = [{version!r}]\n"
            '    base = {{"model": {{"path": "builtin:tiny-llama-support"}}, '
            '"data": {{"chat_template": False}}}}\n\n'
            "    @pytest.fixture\n    def adapter(self):\n        return {cls}()\n")


def assert_one_check(report: dict[str, Any], says: str | None,
                     check: str | None = None) -> None:
    """The one check the selection ran (``check``: the one whose name holds it) passed, or,
    with ``says``, failed with a reason that holds it."""
    (result,) = [c for c in report["checks"] if check is None or check in c["check"]]
    if says is None:
        assert result["state"] == "passed", result
    else:
        assert result["state"] == "failed" and says in result["reason"], result
