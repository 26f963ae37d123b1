"""The conformance kit's own mutation suite: every realistic adapter bug in ``mutants.py``,
applied to a copy of the adapter, contract or TRL plugin, must fail the kit, except the few
listed below with the reason the kit cannot see them. The kill rate per engine is printed."""

from __future__ import annotations

import pytest
from mutants import MUTANTS
from mutation_run import baselines, run_all, table
from optional_installs import TRL_PLUGIN_MISSING, trl_plugin_installed

# survivor -> why the kit cannot kill it (each a known limit, not a pass)
KNOWN_SURVIVORS: dict[str, str] = {}


def _kills(mutants, capsys) -> None:
    results = run_all(baselines(mutants) + mutants, jobs=2)
    unmutated = [r for r in results if r["kind"] == "baseline"]
    results = [r for r in results if r["kind"] != "baseline"]
    # a kit that fails the adapters as they are would "kill" every mutant
    assert not [r for r in unmutated if r["killed"]], unmutated
    with capsys.disabled():
        print("\n" + table(results))
    stale = [r["reasons"] for r in results if r["killed"] is None]
    assert not stale, stale
    survivors = {str(r["name"]) for r in results if not r["killed"]}
    assert survivors <= set(KNOWN_SURVIVORS), sorted(survivors - set(KNOWN_SURVIVORS))


@pytest.mark.slow
def test_the_kit_kills_every_realistic_adapter_bug(capsys):
    assert len(MUTANTS) >= 60
    _kills([m for m in MUTANTS if m.engine != "trl"], capsys)


@pytest.mark.slow
@pytest.mark.skipif(not trl_plugin_installed(), reason=TRL_PLUGIN_MISSING)
def test_the_kit_kills_every_realistic_bug_of_the_trl_plugin(capsys):
    _kills([m for m in MUTANTS if m.engine == "trl"], capsys)


def test_first_kills_name_mutants_and_checks_that_exist():
    """A hint naming a mutant or a check no longer there only costs time, so nothing else
    notices it: held here instead."""
    from mutation_run import first_kills

    from stateset_backend.conformance import AdapterConformance

    checks = {name.removeprefix("test_") for name in dir(AdapterConformance)
              if name.startswith("test_")}
    hints = first_kills()
    assert set(hints) <= {m.name for m in MUTANTS}
    assert set(hints.values()) <= checks, set(hints.values()) - checks
