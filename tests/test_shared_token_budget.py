"""``data.max_total_tokens``: a budget a prompt and its response share (vLLM's max_model_len),
the limit NeMo RL's recipes set. An engine that has it reads it; one that caps every response
at a fixed length refuses the spec; a value that cannot bind is the experiment without one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from packaging.version import Version

from stateset_backend.common.errors import Unsupported
from stateset_backend.contracts.capabilities import required_capabilities
from stateset_backend.engines.registry import build_registry
from stateset_backend.importing.launch import import_file
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.digest import experiment_digest
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.rules import explain_rows

ROOT = Path(__file__).parent.parent
RECIPES = ROOT / "examples" / "recipes"
MAIN = ROOT / "examples" / "support-routing.json"


def _doc(path: Path = MAIN, **data: object) -> dict:
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["data"].update(data)
    return doc


def test_a_budget_that_cannot_bind_is_the_experiment_without_one():
    """48 + 2 tokens is the most a prompt and response can hold: a budget of 50 or more
    changes nothing, so it reads as none and keeps the digest; 49 binds and changes it."""
    none = experiment_digest(ExperimentSpec.model_validate(_doc()))
    for total in (50, 4096):
        spec = ExperimentSpec.model_validate(_doc(max_total_tokens=total))
        assert spec.data.max_total_tokens is None
        assert experiment_digest(spec) == none
    # whole numbers written as floats are the same numbers
    floats = ExperimentSpec.model_validate(_doc(max_total_tokens=150.0, max_prompt_tokens=48.0))
    assert floats.data.max_total_tokens is None and experiment_digest(floats) == none
    binding = ExperimentSpec.model_validate(_doc(max_total_tokens=49))
    assert binding.data.max_total_tokens == 49
    assert experiment_digest(binding) != none
    assert "shared_token_budget" in required_capabilities(binding)
    assert "shared_token_budget" not in required_capabilities(
        ExperimentSpec.model_validate(_doc()))


@pytest.mark.parametrize(("change", "words"), [
    ({"max_total_tokens": 48}, "must exceed data.max_prompt_tokens (48)"),
    ({"max_total_tokens": 0}, "max_total_tokens"),
])
def test_a_budget_with_no_room_for_a_response_is_one_line_and_exit_2(
        tmp_path, cli_in_process, change, words):
    doc = _doc(**change)
    doc["data"]["train"]["uri"] = str(ROOT / "examples" / doc["data"]["train"]["uri"])
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    proc = cli_in_process("validate", path)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_sft_and_conversations_refuse_it():
    sft = _doc(max_total_tokens=49)
    sft["algorithm"] = {"objective": "sft"}
    sft["budget"].pop("mini_batches", None)
    sft["budget"].pop("ppo_epochs", None)
    with pytest.raises(ValueError, match="sft samples none"):
        ExperimentSpec.model_validate(sft)


@pytest.mark.parametrize(("engine", "version", "why"), [
    ("verl", "0.9.1", "whatever its prompt's length"),
    ("openrlhf", "0.11.2", "only when --max_new_tokens is unset"),
])
def test_an_engine_that_caps_every_response_alike_refuses_it(explained, engine, version, why):
    spec = ExperimentSpec.model_validate(_doc(RECIPES / "nemo-rl-grpo_math_1B.json",
                                              max_total_tokens=300))
    with pytest.raises(Unsupported, match="missing shared_token_budget"):
        make_plan(spec, build_registry().get(engine), version, base_dir=RECIPES)
    row = explained(spec, engine, version, "data.max_total_tokens")
    assert row.state == "refused" and why in row.reason


def test_nemo_rl_reads_the_budget_as_its_sequence_limit():
    """NeMo RL sizes vLLM's max_model_len from policy.max_total_sequence_length: the budget
    goes there, and each response keeps its own limit in max_new_tokens."""
    spec = ExperimentSpec.model_validate(_doc(RECIPES / "nemo-rl-grpo_math_1B.json",
                                              max_total_tokens=300))
    plan = make_plan(spec, build_registry().get("nemo-rl"), "0.7.0", base_dir=RECIPES)
    assert plan.native["policy.max_total_sequence_length"] == 300
    assert plan.native["policy.generation.max_new_tokens"] == 256
    assert plan.native["data.max_input_seq_length"] == 257
    assert "shared_token_budget" in plan.required_capabilities


def test_an_adapter_that_predates_the_field_refuses_a_spec_that_sets_it():
    """A plugin written before the field existed has no rule for it: a spec that leaves it
    unset plans as before, and one that sets it is refused by name, not an adapter bug."""
    registry = build_registry()
    entry = registry.get("nemo-rl")
    dialect = entry.adapter.contract.dialect(Version("0.7.0"))
    rules = dict(entry.adapter.rules(dialect))
    rules.pop("data.max_total_tokens")
    unset = ExperimentSpec.model_validate(_doc(RECIPES / "nemo-rl-grpo_math_1B.json"))
    assert all(r.state != "refused" for r in explain_rows(unset, rules, dialect, "old"))
    spec = ExperimentSpec.model_validate(_doc(RECIPES / "nemo-rl-grpo_math_1B.json",
                                              max_total_tokens=300))
    row = next(r for r in explain_rows(spec, rules, dialect, "old")
               if r.path == "data.max_total_tokens")
    assert row.state == "refused" and "predates data.max_total_tokens" in row.reason


def test_a_nemo_rl_recipe_that_shares_its_budget_imports_with_it():
    """NeMo RL's smoke recipe keeps its parent's 512-token sequence limit, which its prompt
    filter and its generation limit both default to: the spec shares 512 tokens between a
    prompt of at most 511 and its response, and its plan gives back all three limits as NeMo
    RL reads them."""
    doc = import_file(build_registry(), "nemo-rl", RECIPES / "nemo-rl-v0.7.0" / "grpo_smoke.yaml",
                      "0.7.0").to_json()
    data = doc["spec"]["data"]
    assert (data["max_prompt_tokens"], data["max_response_tokens"],
            data["max_total_tokens"]) == (511, 512, 512)
    fates = {s["key"]: s for s in doc["settings"]}
    for key in ("policy.max_total_sequence_length", "data.max_input_seq_length"):
        if key in fates:
            assert fates[key]["reproduced"], fates[key]
    spec = copy.deepcopy(doc["spec"])
    assert ExperimentSpec.model_validate(spec).data.max_total_tokens == 512
