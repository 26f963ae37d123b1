"""Plugin registry: built-ins and third-party adapters through one hook; broken plugins reported."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from stateset_backend.common.errors import InvalidInput
from stateset_backend.engines import registry as registry_module
from stateset_backend.engines.registry import PluginError, build_registry


def test_builtin_adapters_are_registered_through_the_hook():
    reg = build_registry(only=set())
    assert {"native", "verl", "openrlhf", "nemo-rl"} <= set(reg.adapters)
    native = reg.adapters["native"]
    assert (native.plugin, native.distribution) == ("builtin", "stateset-backend")


def test_installed_example_plugin_is_discovered_by_entry_point():
    reg = build_registry(only={"echo"})
    echo = reg.adapters["echo"]
    assert (echo.plugin, echo.distribution, echo.version) == ("echo", "stateset-echo-engine",
                                                              "1.2.0")
    assert echo.adapter.installed_version() == "1.2.0"


def test_a_plugin_that_fails_to_import_is_listed_and_the_rest_keep_working():
    reg = build_registry()
    assert "echo" in reg.adapters and "native" in reg.adapters
    failure = next(f for f in reg.failures if f.plugin == "broken")
    assert failure.distribution == "stateset-broken-plugin"
    assert "some_missing_dependency" in failure.error


def test_strict_mode_makes_a_broken_plugin_fatal():
    with pytest.raises(PluginError, match="plugin 'broken' failed to load"):
        build_registry(strict=True)


def test_unknown_engine_names_the_registered_ones():
    with pytest.raises(InvalidInput, match=r"unknown engine 'vllm' \(registered: .*native"):
        build_registry(only=set()).get("vllm")


def _with_entry_points(monkeypatch, **targets: str):
    """Only the built-ins and the given (misbehaving) plugins are installed."""
    targets = {"builtin": "stateset_backend.adapters", **targets}
    eps = [metadata.EntryPoint(name, value, registry_module.ENTRY_POINT_GROUP)
           for name, value in targets.items()]
    monkeypatch.setattr(registry_module.metadata, "entry_points",
                        lambda group: eps if group == registry_module.ENTRY_POINT_GROUP else [])


@pytest.mark.parametrize("target, error", [
    ("plugin_samples:raises_in_hook", "RuntimeError: adapter setup exploded"),
    ("plugin_samples:takes_native_name", "already registered by 'builtin'"),
    ("plugin_samples:registers_nonsense", "not an EngineAdapter"),
    ("plugin_samples:wrong_hook_signature", "not_a_hook_argument"),
    ("plugin_samples:does_not_exist", "AttributeError"),
])
def test_each_way_a_plugin_can_break_is_contained(monkeypatch, target, error):
    _with_entry_points(monkeypatch, bad=target)
    reg = build_registry(strict=False)
    assert [f.plugin for f in reg.failures] == ["bad"]
    assert error in reg.failures[0].error
    assert reg.adapters["native"].plugin == "builtin"


def test_a_hook_without_its_mark_is_named_not_silently_empty(monkeypatch):
    _with_entry_points(monkeypatch, forgot="plugin_samples:forgot_hookimpl")
    reg = build_registry(strict=False)
    assert [f.plugin for f in reg.failures] == ["forgot"]
    assert "implements no hook" in reg.failures[0].error


def test_two_plugins_of_one_name_are_both_refused_by_name(monkeypatch):
    """Which of two plugins named alike pluggy kept would be the order the environment lists
    them in: neither loads, and the failure names both, not pluggy's registry dump."""
    eps = [metadata.EntryPoint(name, value, registry_module.ENTRY_POINT_GROUP)
           for name, value in (("builtin", "stateset_backend.adapters"),
                               ("twin", "plugin_samples:no_arguments"),
                               ("twin", "plugin_samples:takes_native_name"))]
    monkeypatch.setattr(registry_module.metadata, "entry_points",
                        lambda group: eps if group == registry_module.ENTRY_POINT_GROUP else [])
    reg = build_registry(strict=False)
    assert [f.plugin for f in reg.failures] == ["twin", "twin"]
    error = reg.failures[0].error
    assert "registered by 2 installed distributions" in error and "{" not in error
    assert "plugin_samples:no_arguments" in error and "plugin_samples:takes_native_name" in error
    assert reg.adapters["native"].plugin == "builtin"
    with pytest.raises(PluginError, match="registered by 2 installed distributions"):
        build_registry(strict=True)


def test_hook_may_take_fewer_arguments(monkeypatch):
    _with_entry_points(monkeypatch, quiet="plugin_samples:no_arguments")
    assert build_registry(strict=False).failures == []


def test_engines_json_lists_adapters_and_failures(cli):
    proc = cli("engines", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    by_name = {e["engine"]: e for e in doc["engines"]}
    assert by_name["verl"]["supported"] == ">=0.4.1"
    assert by_name["native"]["installed"] is not None
    assert by_name["echo"]["distribution"] == "stateset-echo-engine"
    assert any(cap["versions"] == ">=0.7" and "objective:cispo" in cap["provides"]
               for cap in by_name["verl"]["capabilities"])
    assert [f["plugin"] for f in doc["failed_plugins"]] == ["broken"]


def test_engines_table_mentions_the_broken_plugin(cli):
    proc = cli("engines")
    assert proc.returncode == 0
    assert "verl" in proc.stdout and "plugin broken failed to load" in proc.stdout


def test_plugin_selection_and_strict_mode_from_the_environment(cli):
    proc = cli("engines", "--json", env={"STATESET_BACKEND_PLUGINS": "echo"})
    doc = json.loads(proc.stdout)
    assert doc["failed_plugins"] == [] and "echo" in {e["engine"] for e in doc["engines"]}
    proc = cli("engines", env={"STATESET_BACKEND_PLUGINS": "broken",
                               "STATESET_BACKEND_STRICT_PLUGINS": "1"})
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("stateset-backend: error: plugin 'broken' failed")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("target, error", [
    ("plugin_sample_exits", "SystemExit: this plugin exits at import"),
    ("plugin_sample_interrupts", "KeyboardInterrupt"),
])
def test_a_plugin_that_exits_or_interrupts_at_import_is_contained(monkeypatch, target, error):
    _with_entry_points(monkeypatch, bad=target)
    reg = build_registry(strict=False)
    assert [f.plugin for f in reg.failures] == ["bad"]
    assert error in reg.failures[0].error
    assert "native" in reg.adapters


def test_an_adapter_that_raises_is_one_line_naming_its_plugin(monkeypatch):
    from stateset_backend.common.errors import AdapterBug
    from stateset_backend.conformance.specs import MINIMAL
    from stateset_backend.plan.launch_plan import make_plan
    from stateset_backend.spec.files import parse_spec

    _with_entry_points(monkeypatch, boom="plugin_samples:registers_exploding")
    entry = build_registry(strict=False).get("exploding")
    with pytest.raises(AdapterBug, match=r"exploding adapter \(plugin 'boom'.*rules blew up"):
        make_plan(parse_spec(MINIMAL), entry, "0.1.0")
    with pytest.raises(AdapterBug, match="version probe blew up"), \
            entry.guard("detecting the installed version"):
        entry.adapter.installed_version()
