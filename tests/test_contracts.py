"""Contracts: checked-in files are valid, bad contracts are refused, the check names the way out."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.contracts.capabilities import VOCABULARY, required_capabilities
from stateset_backend.contracts.loader import check, parse_contract
from stateset_backend.spec.files import parse_spec

ENGINES = ["native", "verl", "openrlhf", "nemo-rl"]


def _contract_doc(engine: str) -> dict:
    text = resources.files("stateset_backend.contracts").joinpath(f"{engine}.json").read_text()
    return json.loads(text)


def _schema() -> dict:
    return json.loads(resources.files("stateset_backend.schemas").joinpath(
        "contract.json").read_text())


@pytest.mark.parametrize("engine", ENGINES)
def test_packaged_contracts_validate_against_the_json_schema(engine):
    jsonschema.Draft202012Validator(_schema()).validate(_contract_doc(engine))
    contract = parse_contract(_contract_doc(engine), source=engine)
    assert contract.engine == engine
    assert contract.all_capabilities() <= VOCABULARY


@pytest.mark.parametrize("engine, supported", [
    ("verl", ">=0.4.1"), ("openrlhf", ">=0.9.8"), ("nemo-rl", ">=0.5.0rc0,<0.8")])
def test_external_engines_declare_their_real_version_ranges(engine, supported):
    assert parse_contract(_contract_doc(engine), source=engine).supported == supported


def _bad(mutate) -> str:
    doc = _contract_doc("verl")
    mutate(doc)
    with pytest.raises(InvalidInput) as info:
        parse_contract(doc, source="bad.json")
    return info.value.message


def test_unknown_capability_is_refused():
    msg = _bad(lambda d: d["capabilities"][0]["provides"].append("objective:magic"))
    assert "unknown capability 'objective:magic'" in msg


def test_a_dialect_extends_another_with_its_differences():
    from packaging.version import Version

    contract = parse_contract(_contract_doc("openrlhf"), source="openrlhf")
    base, extended = (contract.dialect(Version(v)) for v in ("0.9.8", "0.10.1"))
    assert extended.keys["best_metric_key"] == "--best_metric_key"
    assert base.keys.get("best_metric_key") is None
    assert {k: v for k, v in extended.keys.items() if k != "best_metric_key"} == \
        {k: v for k, v in base.keys.items() if k != "best_metric_key"}
    assert set(base.defaults) < set(extended.defaults)  # defaults are merged too


def test_extending_an_unknown_dialect_is_refused():
    def mutate(doc):
        doc["dialects"][1]["extends"] = "no-such-dialect"

    assert "extends 'no-such-dialect', which is not a base dialect" in _bad(mutate)


def test_malformed_version_range_is_refused():
    msg = _bad(lambda d: d.update(supported=">=zero"))
    assert "not a PEP 440 version specifier" in msg


def test_overlapping_dialects_are_refused():
    msg = _bad(lambda d: d["dialects"].append({"versions": ">=0.9", "name": "dup", "keys": {}}))
    assert "matches 2 dialects" in msg


def test_gap_between_dialects_is_refused():
    msg = _bad(lambda d: d["dialects"].pop(1))
    assert "matches 0 dialects" in msg


def _verl():
    return parse_contract(_contract_doc("verl"), source="verl")


@pytest.mark.parametrize("version, dialect", [
    ("0.4.1", "v0.4"), ("0.5.0", "v0.4"), ("0.6.0", "v0.6.0"), ("0.6.1", "v0.6.1"),
    ("0.7.0", "v0.7.0"), ("0.7.1", "v0.7.1"), ("0.8.0", "v0.8"), ("0.9.0", "v0.9.0"),
    ("0.9.1", "v0.9.1")])
def test_dialect_follows_the_version(version, dialect):
    from packaging.version import Version

    assert _verl().dialect(Version(version)).name == dialect


def test_openrlhf_renamed_every_flag_at_0_10_2():
    from packaging.version import Version

    c = parse_contract(_contract_doc("openrlhf"), source="openrlhf")
    assert c.dialect(Version("0.10.1")).keys["model"] == "--pretrain"
    assert c.dialect(Version("0.10.2")).keys["model"] == "--actor.model_name_or_path"


def test_check_names_each_missing_capability_and_where_it_exists(minimal):
    minimal["algorithm"] = {"objective": "cispo"}
    minimal["rollout"] = {"backend": "vllm"}
    minimal["algorithm"]["advantage"] = {"std": "population"}
    report = check(_verl(), "0.6.0", required_capabilities(parse_spec(minimal)))
    missing = {m.capability: m.available_in for m in report.missing}
    assert missing == {"objective:cispo": ">=0.7", "advantage_std:population": None}
    with pytest.raises(Unsupported) as info:
        report.raise_if_missing()
    assert "objective:cispo (available in verl >=0.7)" in info.value.message
    assert "advantage_std:population (not available in any verl version)" in info.value.message


def test_a_gap_the_contract_explains_is_named_with_its_reason(minimal):
    doc = _contract_doc("verl")
    doc["gaps"] = {"advantage_std:population": "verl divides by the unbiased std"}
    contract = parse_contract(doc, source="verl")
    minimal["algorithm"] = {"objective": "grpo", "advantage": {"std": "population"}}
    with pytest.raises(Unsupported) as info:
        check(contract, "0.6.0", required_capabilities(parse_spec(minimal))).raise_if_missing()
    assert "advantage_std:population (verl divides by the unbiased std)" in info.value.message
    # a contract without gaps keeps its digest
    assert "gaps" not in _verl().to_json() and contract.digest != _verl().digest
    msg = _bad(lambda d: d.update(gaps={"objective:magic": "no"}))
    assert "unknown capability 'objective:magic'" in msg


def test_check_passes_when_everything_is_provided(minimal):
    minimal["rollout"] = {"backend": "vllm"}
    assert check(_verl(), "0.9.1", required_capabilities(parse_spec(minimal))).ok


def test_version_outside_the_supported_range(minimal):
    with pytest.raises(Unsupported, match=r"verl 0\.3\.0 is not supported \(supported: "
                                          r"verl >=0\.4\.1\)"):
        check(_verl(), "0.3.0", frozenset())


def test_malformed_version_string_is_invalid_input():
    with pytest.raises(InvalidInput, match="not a PEP 440 version"):
        check(_verl(), "latest", frozenset())


def test_required_capabilities_follow_the_spec(full):
    need = required_capabilities(parse_spec(full))
    assert need <= VOCABULARY
    assert {"clip:asymmetric", "lora", "multi_node", "checkpoint",
            "validation", "entropy_bonus"} <= need
    assert ("multi_turn" in need) == (full["environment"]["kind"] == "multi_turn")
