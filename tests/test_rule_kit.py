"""The rule kit: every leaf ends pinned, refused or declared; nothing else reaches a launch."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from stateset_backend.common.errors import AdapterBug, InvalidInput, Unsupported
from stateset_backend.contracts.loader import Dialect, parse_contract
from stateset_backend.engines.adapter import DialectKeys, check_all_pinned, unpinned_defaults
from stateset_backend.spec.digest import experiment_digest
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.modeltree import all_leaf_paths
from stateset_backend.translate.rules import (
    CORE_HANDLED,
    Hardcoded,
    explain_rows,
    hardcoded,
    na,
    to,
    translate,
)

EPSILON = "advantage-epsilon"


def _dialect(**extra: Any) -> Dialect:
    return Dialect.model_validate({"versions": ">=1", "name": "d1", **extra})


def _rules(**overrides: Any) -> dict[str, Any]:
    rules: dict[str, Any] = {p: to(p) for p in all_leaf_paths(ExperimentSpec)
                             if p not in CORE_HANDLED}
    rules["name"] = na("named by the run id")
    rules["resources.nodes"] = na("where it runs")
    rules["resources.gpus_per_node"] = na("where it runs")
    return {**rules, **overrides}


DECLARED = {EPSILON: {"setting": "algorithm.advantage.epsilon", "engine_value": 1e-9,
                      "description": "adds 1e-9 to the std, not the spec's epsilon"}}


def _row(spec: ExperimentSpec, rules: dict[str, Any], dialect: Dialect, path: str):
    return next(r for r in explain_rows(spec, rules, dialect, "toy") if r.path == path)


def test_a_hardcoded_value_equal_to_the_spec_is_pinned(minimal):
    spec = parse_spec(minimal)
    rules = _rules(**{"algorithm.advantage.epsilon": hardcoded(1e-6, EPSILON)})
    row = _row(spec, rules, _dialect(), "algorithm.advantage.epsilon")
    assert row.state == "pinned" and row.effective == 1e-6 and "hard-coded" in row.reason


def test_a_hardcoded_other_value_is_refused_unless_the_dialect_declares_it(minimal):
    spec = parse_spec(minimal)
    rules = _rules(**{"algorithm.advantage.epsilon": hardcoded(1e-9, EPSILON)})
    refused = _row(spec, rules, _dialect(), "algorithm.advantage.epsilon")
    assert refused.state == "refused" and "1e-09" in refused.reason
    with pytest.raises(Unsupported, match=re.escape("algorithm.advantage.epsilon")):
        translate(spec, rules, _dialect(), "toy", "1.0")

    declared = _row(spec, rules, _dialect(deviations=DECLARED), "algorithm.advantage.epsilon")
    assert declared.state == "declared" and declared.effective == 1e-9
    assert declared.deviation_name == EPSILON
    translation = translate(spec, rules, _dialect(deviations=DECLARED), "toy", "1.0")
    assert translation.deviations == [{
        "setting": "algorithm.advantage.epsilon", "deviation": EPSILON, "spec_value": 1e-6,
        "engine_value": 1e-9, "description": DECLARED[EPSILON]["description"]}]


def test_strict_equivalence_refuses_a_declared_deviation(minimal):
    spec = parse_spec({**minimal, "equivalence": "strict"})
    rules = _rules(**{"algorithm.advantage.epsilon": hardcoded(1e-9, EPSILON)})
    with pytest.raises(Unsupported, match=re.escape("equivalence: strict")):
        translate(spec, rules, _dialect(deviations=DECLARED), "toy", "1.0")


def test_a_deviation_declared_for_another_setting_does_not_cover_this_one(minimal):
    spec = parse_spec(minimal)
    rules = _rules(**{"algorithm.advantage.epsilon": lambda v, s: Hardcoded(1e-9, "other")})
    other = {"other": {**DECLARED[EPSILON], "setting": "algorithm.clip.low"}}
    assert _row(spec, rules, _dialect(deviations=other),
                "algorithm.advantage.epsilon").state == "refused"


def test_not_applicable_on_an_experiment_setting_is_an_adapter_bug(minimal):
    spec = parse_spec(minimal)
    with pytest.raises(AdapterBug, match=re.escape("optim.betas")):
        explain_rows(spec, _rules(**{"optim.betas": na("uses its own")}), _dialect(), "toy")


def test_a_leaf_without_a_rule_is_an_adapter_bug(minimal):
    rules = _rules()
    del rules["optim.eps"]
    with pytest.raises(AdapterBug, match=re.escape("no rule for optim.eps")):
        explain_rows(parse_spec(minimal), rules, _dialect(), "toy")


def test_moot_settings_are_inert_on_every_engine(minimal):
    doc = copy.deepcopy(minimal)
    doc["algorithm"] = {"objective": "dr_grpo"}
    rows = {r.path: r for r in explain_rows(parse_spec(doc), _rules(), _dialect(), "toy")}
    assert rows["algorithm.advantage.epsilon"].state == "inert"
    assert rows["evaluation.temperature"].state == "inert"  # never validates
    assert rows["optim.betas"].state == "pinned"


def test_engine_defaults_the_launch_leaves_unset_stop_the_plan():
    dialect = _dialect(defaults={"actor.optim.betas": [0.9, 0.999], "+data.seed": 1})
    assert unpinned_defaults(dialect, {"data.seed": 3}) == ["actor.optim.betas"]
    with pytest.raises(AdapterBug, match=re.escape("actor.optim.betas")):
        check_all_pinned("toy", dialect, {"+data.seed": 3})
    check_all_pinned("toy", dialect, {"actor.optim.betas": [0.9, 0.95], "data.seed": 3})


def test_a_launch_names_the_recorded_defaults_its_entry_point_does_not_read():
    """An engine with two trainers records both configs' defaults; a launch of one trainer
    sets its own and names the other's, with the reason."""
    dialect = _dialect(defaults={"lr": 1e-6, "sft.lr": 2e-5})
    unread = {"sft.lr": "the SFT trainer's key: this launch runs the RL trainer"}
    assert unpinned_defaults(dialect, {"lr": 1e-3}, unread) == []
    check_all_pinned("toy", dialect, {"lr": 1e-3}, unread)
    with pytest.raises(AdapterBug, match=re.escape("leaves sft.lr")):
        check_all_pinned("toy", dialect, {"lr": 1e-3})
    with pytest.raises(AdapterBug, match="does not read other, which the d1 dialect records"):
        check_all_pinned("toy", dialect, {"lr": 1e-3, "sft.lr": 1.0}, {"other": "why"})
    with pytest.raises(AdapterBug, match=re.escape("both sets sft.lr")):
        check_all_pinned("toy", dialect, {"lr": 1e-3, "sft.lr": 1.0}, unread)
    with pytest.raises(AdapterBug, match="gives no reason"):
        check_all_pinned("toy", dialect, {"lr": 1e-3}, {"sft.lr": " "})


class _Keys(DialectKeys):
    lr: str
    loss_agg: str | None


def test_typed_dialect_keys_fail_when_the_contract_loads():
    from stateset_backend.engines.adapter import _typed_keys

    contract = parse_contract({
        "schema": "stateset-backend/contract/v1", "engine": "toy", "distribution": None,
        "supported": ">=1", "capabilities": [],
        "dialects": [{"versions": ">=1", "name": "d1", "keys": {"lr": "--lr"}}]},
        source="toy.json")
    with pytest.raises(InvalidInput, match=re.escape("dialect 'd1': keys.loss_agg")):
        _typed_keys(contract, contract.dialects[0], _Keys)


def test_extends_merges_keys_defaults_and_deviations():
    contract = parse_contract({
        "schema": "stateset-backend/contract/v1", "engine": "toy", "distribution": None,
        "supported": ">=1", "capabilities": [],
        "dialects": [
            {"versions": ">=1,<2", "name": "old", "extends": "new",
             "keys": {"loss_agg": None}, "defaults": {"--lr": 1e-5}},
            {"versions": ">=2", "name": "new", "keys": {"lr": "--lr", "loss_agg": "--agg"},
             "defaults": {"--lr": 1e-6, "--agg": "token"}, "deviations": DECLARED}]},
        source="toy.json")
    old = contract.dialects[0]
    assert old.keys == {"lr": "--lr", "loss_agg": None}
    assert old.defaults == {"--lr": 1e-5, "--agg": "token"}
    assert set(old.deviations) == {EPSILON}


def test_a_v1_document_validates_and_names_every_v2_setting(minimal):
    v1 = {**minimal, "version": 1}
    spec = parse_spec(v1)
    assert spec.optim.betas == (0.9, 0.999) and spec.algorithm.kl.clamp == 10.0
    assert experiment_digest(spec) == experiment_digest(parse_spec(minimal))


def test_k3_is_clamped_by_default_and_k1_is_not(minimal):
    doc = copy.deepcopy(minimal)
    doc["algorithm"] = {"objective": "grpo", "kl": {"coef": 0.1, "estimator": "k1"}}
    assert parse_spec(doc).algorithm.kl.clamp is None
    doc["algorithm"]["kl"] = {"coef": 0.1, "estimator": "k1", "clamp": 5}
    assert parse_spec(doc).algorithm.kl.clamp == 5


def test_greedy_validation_cannot_take_several_samples(minimal):
    with pytest.raises(InvalidInput, match=re.escape("greedy")):
        parse_spec({**minimal, "evaluation": {"samples": 4}})


@pytest.mark.parametrize("option", [
    "actor.clip_ratio", "~actor.clip_ratio", "+actor.clip_ratio", "++actor.clip_ratio",
    "actor", "+actor", "actor.clip_ratio=0.5", "actor.clip_ratio.0",
])
def test_engine_options_cannot_reach_a_pinned_hydra_key_in_any_spelling(option):
    from stateset_backend.translate.rules import option_conflict

    assert option_conflict(option, {"actor.clip_ratio": 0.2}) == "actor.clip_ratio"


@pytest.mark.parametrize("option, conflicts", [
    ("--actor.adam.lr", True), ("--actor.adam.l", True), ("--actor.adam", True),
    ("--actor.adam.lr=1", True), ("--actor.adam.lrx", False), ("--train.seed", False),
])
def test_engine_options_cannot_abbreviate_a_pinned_flag(option, conflicts):
    from stateset_backend.translate.rules import option_conflict

    assert (option_conflict(option, ["--actor.adam.lr"]) is not None) is conflicts


def test_unrelated_engine_options_pass(minimal):
    from stateset_backend.translate.rules import option_conflict

    assert option_conflict("trainer.val_before_train", {"trainer.logger": 1}) is None
    assert option_conflict("actor.clip", {"actor.clip_ratio": 1}) is None


def test_rules_that_are_not_a_mapping_are_named_as_such():
    """An adapter whose rules() returns a list would otherwise read as lacking a rule for
    the spec's first leaf, which sends its author looking for the wrong mistake."""
    from stateset_backend.adapters.native.adapter import NativeAdapter
    from stateset_backend.conformance.specs import MINIMAL

    adapter = NativeAdapter()
    dialect = adapter.contract.dialects[0]
    with pytest.raises(AdapterBug, match=r"rules\(\) returned a list, not a mapping"):
        explain_rows(parse_spec(MINIMAL), list(adapter.rules(dialect).items()), dialect,
                     "native")
