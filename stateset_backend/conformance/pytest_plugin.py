"""The kit's pytest plugin (entry point ``pytest11``, installed with the ``conformance`` extra):
declared gaps show as ``unsupported`` (letter ``U``) instead of skipped, and
``--conformance-report PATH`` writes every check's outcome as JSON.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

UNSUPPORTED = "unsupported: "
UNVERIFIED = "unverified: "
STATES = ("passed", "failed", "unverified", "unsupported", "skipped")


@dataclass
class Outcome:
    """One check on one adapter: the test, its parameters, state and reason."""

    check: str
    params: dict[str, str]
    state: str
    reason: str = ""
    seconds: float = 0.0


@dataclass
class Collector:
    """Outcomes of a pytest run, one per test (setup, call and teardown folded together)."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    _params: dict[str, dict[str, str]] = field(default_factory=dict)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            callspec = getattr(item, "callspec", None)
            self._params[item.nodeid] = {k: str(v) for k, v in
                                         (callspec.params.items() if callspec else [])}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = report.nodeid.split("::")[-1].split("[", 1)[0].removeprefix("test_")
        outcome = self.outcomes.setdefault(report.nodeid, Outcome(
            name, self._params.get(report.nodeid, {}), "passed"))
        outcome.seconds += report.duration
        if report.passed and report.when == "call" and hasattr(report, "wasxfail"):
            outcome.state, outcome.reason = "failed", f"expected to fail: {report.wasxfail}"
        elif report.failed:
            if outcome.state != "failed":
                outcome.state, outcome.reason = "failed", _reason(report)
        elif report.skipped:
            if hasattr(report, "wasxfail"):
                outcome.state, outcome.reason = "failed", f"known failure: {report.wasxfail}"
            else:
                reason = _reason(report)
                outcome.state = "unsupported" if reason.startswith(UNSUPPORTED) else \
                    "unverified" if reason.startswith(UNVERIFIED) else "skipped"
                outcome.reason = reason.removeprefix(UNSUPPORTED).removeprefix(UNVERIFIED)

    def report(self) -> dict[str, Any]:
        counts = dict.fromkeys(STATES, 0)
        for outcome in self.outcomes.values():
            counts[outcome.state] += 1
        return {"counts": counts, "seconds": round(time.monotonic() - self.started, 2),
                "checks": [asdict(o) for o in self.outcomes.values()]}


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    text = str(longrepr or "")
    return text.strip().splitlines()[-1] if text.strip() else ""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("stateset-backend conformance").addoption(
        "--conformance-report", metavar="PATH", default=None,
        help="write every conformance check's outcome (passed, failed, unsupported) as JSON")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("conformance_report", None)
    if path:
        config.pluginmanager.register(_ReportWriter(Path(path)), "conformance-report")


class _ReportWriter(Collector):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def pytest_sessionfinish(self) -> None:
        self.path.write_text(json.dumps(self.report(), indent=2) + "\n", encoding="utf-8")


def pytest_report_teststatus(report: pytest.TestReport,
                             config: pytest.Config) -> tuple[str, str, str] | None:
    if report.skipped and not hasattr(report, "wasxfail") and \
            _reason(report).startswith(UNSUPPORTED):
        return "unsupported", "U", "UNSUPPORTED"
    if report.skipped and not hasattr(report, "wasxfail") and \
            _reason(report).startswith(UNVERIFIED):
        return "unverified", "V", "UNVERIFIED"
    return None
