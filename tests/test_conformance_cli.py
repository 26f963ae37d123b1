"""`stateset-backend conformance`: the kit for one registered engine from the command line, and
the generated compatibility matrix, which must match the committed docs/compatibility.md."""

from __future__ import annotations

import json
from pathlib import Path

from stateset_backend import cli
from stateset_backend.conformance import runner

DOCS = Path(__file__).resolve().parents[1] / "docs" / "compatibility.md"


def test_committed_compatibility_matrix_is_current(capsys):
    assert cli.main(["conformance", "--matrix"]) == 0
    generated = capsys.readouterr().out
    assert DOCS.read_text(encoding="utf-8") == generated, \
        "docs/compatibility.md is stale: stateset-backend conformance --matrix > " \
        "docs/compatibility.md"


def test_conformance_runs_the_kit_for_a_registered_engine(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    code = cli.main(["conformance", "echo", "--engine-version", "1.2.0", "--json",
                     str(report_path)])
    out = capsys.readouterr().out
    report = json.loads(report_path.read_text())
    assert code == 0, out
    assert report["engine"] == "echo" and report["engine_versions"] == ["1.2.0"]
    assert report["counts"]["failed"] == 0 and report["counts"]["passed"] > 40
    # the engine's writer comes from the adapter, so the CLI checks collection for real:
    # every case, the invalid ones included, is judged as the adapter's own test class does
    collection = [c for c in report["checks"] if c["check"] == "collection"]
    assert len(collection) >= 9 and {c["state"] for c in collection} == {"passed"}
    states = {c["check"]: c["state"] for c in report["checks"]}
    # one hand-picked version is not meant to cover every dialect: skipped, not failed
    assert states["versions_cover_every_dialect"] == "skipped"
    assert "passed" in out


def test_a_failed_check_exits_5(monkeypatch, capsys):
    def failing(entry, versions, python=None):
        return {"engine": "echo", "distribution": "d", "adapter_version": "1",
                "engine_versions": ["1.2.0"], "seconds": 0.1,
                "counts": {"passed": 0, "failed": 1, "unsupported": 0, "skipped": 0},
                "checks": [{"check": "capability", "params": {"capability": "lora"},
                            "state": "failed", "reason": "no sample plans", "seconds": 0}]}

    monkeypatch.setattr(runner, "run_conformance", failing)
    assert cli.main(["conformance", "echo"]) == runner.FAILED_EXIT == 5
    assert "no sample plans" in capsys.readouterr().out


def test_conformance_needs_one_engine(capsys):
    assert cli.main(["conformance"]) == 2


def test_dialect_versions_cover_every_dialect():
    from packaging.version import Version

    from stateset_backend.engines.registry import build_registry

    for name, entry in build_registry().adapters.items():
        contract = entry.adapter.contract
        versions = runner.dialect_versions(contract)
        assert {contract.dialect(Version(v)).name for v in versions} == \
            {d.name for d in contract.dialects}, name


def test_the_kit_runs_twice_in_one_process():
    from stateset_backend.engines.registry import build_registry

    entry = build_registry().get("native")
    counts = [runner.run_conformance(entry, ["0.1.0"])["counts"] for _ in range(2)]
    assert counts[0] == counts[1] and counts[0]["failed"] == 0 and counts[0]["passed"] > 40


def test_a_range_that_opens_at_a_pre_release_is_checked_at_its_final():
    """NeMo RL's first dialect opens at 0.5.0rc0; its surface (and its users) are 0.5.0's, so
    the CLI's default checks 0.5.0 (the rc had no surface and failed three checks)."""
    from stateset_backend.engines.registry import build_registry

    contract = build_registry().get("nemo-rl").adapter.contract
    assert runner.dialect_versions(contract)[0] == "0.5.0"


def _entry_with(adapter_cls, **methods):
    from stateset_backend.engines.registry import AdapterEntry, build_registry

    base = build_registry().get("echo")
    adapter = type("Patched", (adapter_cls,), methods)()
    return AdapterEntry(adapter, base.plugin, base.distribution, base.version)


def test_the_installed_release_is_among_the_versions_the_kit_checks():
    """The engine's own run is the one check that watches what the engine does, and it runs
    only on the installed release: one the contract covers is among the versions of an
    engine the kit can run (its adapter rehearses), so a contract whose first releases are
    not installed cannot have that check skipped."""
    from stateset_echo_engine.plugin import EchoAdapter

    def runs(installed):
        def version(self, python=None, home=None):
            if isinstance(installed, Exception):
                raise installed
            return installed
        return _entry_with(EchoAdapter, installed_version=version,
                           rehearse=lambda self, plan: None)

    first = runner.dialect_versions(EchoAdapter().contract)
    assert runner.with_installed(list(first), runs("1.2.7"), None) == [*first, "1.2.7"]
    # one already there, none, out of range, a probe that fails: the versions as they were
    for installed in (first[0], None, "0.0.1", RuntimeError("no engine here")):
        assert runner.with_installed(list(first), runs(installed), None) == first
    # an engine the kit cannot run here gains nothing from its installed release
    entry = _entry_with(EchoAdapter, installed_version=lambda self, python=None, home=None:
                        "1.2.7")
    assert runner.with_installed(list(first), entry, None) == first


def test_a_plugin_whose_kit_support_raises_is_one_line_naming_it(tmp_path):
    import pytest
    from stateset_echo_engine.plugin import EchoAdapter

    from stateset_backend.common.errors import AdapterBug

    def kit_support(self):
        raise ModuleNotFoundError("No module named 'echo_kit_helpers'")

    entry = _entry_with(EchoAdapter, kit_support=kit_support)
    with pytest.raises(AdapterBug, match=r"echo adapter \(plugin 'echo'.*failed in "
                                         r"kit_support: ModuleNotFoundError"):
        runner.run_conformance(entry, ["1.2.0"])
