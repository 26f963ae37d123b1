"""Every multi-turn setting on every external engine is pinned, declared or refused: what the
shims cannot honour is refused before launch naming the setting, what the engines hard-code is
declared (and refused under ``equivalence: strict``), and explain shows the multi-turn rows on
every engine."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from optional_installs import trl_plugin_installed

from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter
from stateset_backend.adapters.openrlhf.adapter import OpenRLHFAdapter
from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.common.errors import Unsupported
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import parse_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "external"
DOC = json.loads((EXAMPLES / "support-agent.json").read_text())
ENGINES = {"verl": (VerlAdapter, "0.9.1"), "openrlhf": (OpenRLHFAdapter, "0.11.2"),
           "nemo-rl": (NemoRLAdapter, "0.7.0")}


def _plan(engine: str, doc: dict, version: str | None = None):
    adapter, default = ENGINES[engine]
    entry = AdapterEntry(adapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(parse_spec(doc), entry, version or default, base_dir=EXAMPLES)


def _with(**sections: dict) -> dict:
    doc = copy.deepcopy(DOC)
    for name, values in sections.items():
        doc[name] = {**doc.get(name, {}), **values}
    return doc


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_the_example_plans_with_the_declared_per_turn_credit(engine):
    plan = _plan(engine, DOC)
    assert "per_turn_credit_is_the_return" in {d["deviation"] for d in plan.deviations}
    final = _plan(engine, _with(environment={"reward_placement": "final"}))
    assert "per_turn_credit_is_the_return" not in {d["deviation"] for d in final.deviations}


REFUSED = [
    ({"environment": {"max_failed_share": 0.1}}, "environment.max_failed_share"),
    ({"data": {"prompt_overflow": "truncate_left"}}, "an opening is never truncated"),
    ({"data": {"chat_template": False}}, "renders conversations with the model's chat"),
    ({"algorithm": {"overlong": {"buffer_tokens": 16}}}, "algorithm.overlong"),
    ({"algorithm": {"kl": {"coef": 0.01, "estimator": "k1", "placement": "reward"}}},
     "KL goes in the loss only"),
]


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("change, reason", REFUSED, ids=[r for _, r in REFUSED])
def test_what_no_shim_can_honour_is_refused_before_launch(engine, change, reason):
    with pytest.raises(Unsupported, match="cannot honour") as refused:
        _plan(engine, _with(**change))
    assert reason in str(refused.value)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_strict_equivalence_refuses_the_declared_per_turn_credit(engine):
    with pytest.raises(Unsupported, match="per_turn_credit_is_the_return"):
        _plan(engine, {**DOC, "equivalence": "strict"})


def test_nemo_rl_declares_its_cut_last_turn():
    plan = _plan("nemo-rl", _with(environment={"reward_placement": "final"}))
    (cut,) = [d for d in plan.deviations if d["deviation"] == "turn_cut_at_total_limit"]
    assert cut["setting"] == "environment.max_total_tokens" and cut["spec_value"] == 1024


@pytest.mark.parametrize("engine, version", [("verl", "0.8.0"), ("verl", "0.6.0")])
def test_releases_without_the_shims_interface_are_refused(engine, version):  # exit 3
    with pytest.raises(Unsupported, match=r"tool_use \(available in verl >=0.9.1\)"):
        _plan(engine, DOC, version)


def test_the_first_releases_that_run_conversations_plan_them():
    assert _plan("openrlhf", DOC, "0.9.8").argv[1] == "{run_dir}/stateset_openrlhf_agent.py"
    assert "stateset_conversation.json" in _plan("nemo-rl", DOC, "0.5.0").files


def test_explain_shows_the_multi_turn_settings_on_every_engine(cli):
    proc = cli("explain", "--all-engines", "--effective", "--json",
               ROOT / "examples" / "support-agent.json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["field"]: r["cells"] for r in doc["rows"]}
    for field in ("environment.kind", "environment.max_turns", "environment.max_turn_tokens",
                  "environment.max_total_tokens", "environment.reward_placement",
                  "environment.turn_discount", "environment.step_timeout_s",
                  "environment.max_failed_share"):
        for engine in ("verl", "openrlhf", "nemo-rl", "native"):
            cell = rows[field][engine]
            assert cell["state"] in ("same", "pinned", "declared", "refused"), (field, engine)
            assert cell.get("reason") or cell.get("effective") is not None, (field, engine)


def test_what_only_the_shim_enforces_reads_pinned_and_an_unsupported_turn_limit_refused(cli):
    """A setting no engine key carries holds because the hub's shim enforces it: `pinned`,
    never `same` (which says the engine would do it anyway). An engine that cannot hold a
    conversation refuses its turn limit instead of calling it the same."""
    proc = cli("explain", "--all-engines", "--effective", "--json",
               ROOT / "examples" / "support-agent.json")
    rows = {r["field"]: r["cells"] for r in json.loads(proc.stdout)["rows"]}
    for field in ("environment.entrypoint", "environment.step_timeout_s",
                  "environment.turn_discount", "environment.max_failed_share"):
        for engine in ("verl", "openrlhf", "nemo-rl"):
            assert rows[field][engine]["state"] == "pinned", (field, engine)
        assert rows[field]["native"]["state"] == "same"
    if trl_plugin_installed():  # an engine added by a plugin
        assert rows["environment.max_turns"]["trl"]["state"] == "refused"
