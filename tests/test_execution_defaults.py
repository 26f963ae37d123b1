"""Execution defaults: what a launch sets only for memory, speed or placement, which
``engine_options`` may change, read back by the engine's own parser; every other key the
launch sets (identity, outputs, a spec setting, a fixed switch that changes the math) stays
out of the options' reach, and no declared execution default is a key that changes the math.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from optional_installs import OPENRLHF_WHEELS_MISSING

from stateset_backend.common.errors import InvalidInput
from stateset_backend.conformance.math_keys import (
    RESIZED_BY,
    math_execution_defaults,
    math_keys_of,
)
from stateset_backend.conformance.surface_gen import wheel_reader
from stateset_backend.contracts.loader import parse_version
from stateset_backend.contracts.surfaces import surface
from stateset_backend.engines.registry import build_registry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.execution import (
    ExecutionDefault,
    execution_defaults,
    reached,
    unmet,
)
from stateset_backend.translate.rules import option_conflict

RELEASES = {"openrlhf": ["0.9.8", "0.10.1", "0.10.2", "0.11.1", "0.11.2"],
            "nemo-rl": ["0.5.0", "0.6.0", "0.7.0"],
            # verl before 0.6.1 hard-codes flash-attention: its only declared default, vLLM's
            # compilation, opens with the engine arguments' mapping in 0.6.0
            "verl": ["0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0", "0.9.1"]}


def _plan(doc: dict[str, Any], engine: str, version: str, base: Path,
          options: dict[str, Any] | None = None) -> Any:
    doc = {**doc, "engine_options": {engine: options} if options else {}}
    return make_plan(ExperimentSpec.model_validate(doc), build_registry().get(engine),
                     version, base_dir=base)


def _dialect(engine: str, version: str) -> Any:
    return build_registry().get(engine).adapter.contract.dialect(parse_version(version))


@pytest.mark.parametrize(("engine", "version"),
                         [(e, v) for e, vs in RELEASES.items() for v in vs])
def test_no_execution_default_changes_the_math(engine, version):
    """Each declared key has its reason, is a key the release reads (or part of a mapping it
    reads) and is no math key of the kit's independent list (a key the list counts only
    through a count the launch derives from it stays owned: NeMo RL's max_val_samples)."""
    dialect = _dialect(engine, version)
    declared = execution_defaults(dialect)
    assert declared, f"{engine} {version} declares no execution default"
    options = surface(engine, version)["options"]
    assert not math_execution_defaults(math_keys_of(engine, options, ()), declared, options)
    for key, entry in declared.items():
        assert len(entry.reason) > 40, key
        # a key the release reads, or a part of one of its free mappings (given whole)
        assert key in options or any(key.startswith(o + ".") and isinstance(
            options[o].get("default"), dict) for o in options), key
    assert all(v not in declared for v in RESIZED_BY.values())


def test_a_math_key_declared_as_an_execution_default_is_caught():
    keys = math_keys_of("openrlhf", {}, ())
    assert math_execution_defaults(keys, ["--actor.adam.lr", "--ds.zero_stage"]) == \
        ["--actor.adam.lr"]
    assert math_execution_defaults(keys, ["--actor.adam"]) == ["--actor.adam"]
    # inside a math key the launch holds as an empty mapping, only the declared key gets in
    held = math_keys_of("verl", {}, ())
    inside = ["actor_rollout_ref.model.override_config.attn_implementation"]
    assert math_execution_defaults(held, inside) == inside
    assert not math_execution_defaults(
        held, inside, {"actor_rollout_ref.model.override_config": {"default": {}}})


@pytest.mark.parametrize("option", [
    {"--reward.normalize_enable": True}, {"--algo.kl.target": 0.1},
    {"--ds.load_in_4bit": True}, {"--train.enable_ema": True},
    {"--algo.advantage.is_correction_enable": True}, {"--train.async_enable": True},
    {"--actor.adam.lr": 1e-5}, {"--logger.wandb.run_name": "mine"}])
def test_engine_options_never_reach_a_switch_that_changes_the_math(grpo, tmp_path, option):
    with pytest.raises(InvalidInput, match=r"engine_options\.openrlhf\.--"):
        _plan(grpo, "openrlhf", "0.11.1", tmp_path, option)


def test_openrlhf_execution_defaults_are_taken_and_read_back(engine_reads, grpo, tmp_path):
    options = {"--ds.zero_stage": 3, "--train.micro_batch_size": 1,
               "--rollout.micro_batch_size": 16, "--ds.ring_attn_size": 2,
               "--vllm.num_engines": 2, "--train.dynamic_batch_enable": True}
    read = engine_reads(_plan(grpo, "openrlhf", "0.11.1", tmp_path, options))
    assert {k: read[k] for k in options} == options


def test_a_value_outside_the_declared_ones_is_refused(grpo, tmp_path):
    with pytest.raises(InvalidInput, match=r"--ds\.zero_stage: 0 is not one of"):
        _plan(grpo, "openrlhf", "0.10.2", tmp_path, {"--ds.zero_stage": 0})


@pytest.mark.parametrize(("version", "flag"), [("0.9.8", "--use_dynamic_batch"),
                                             ("0.10.1", "--use_dynamic_batch"),
                                             ("0.10.2", "--train.dynamic_batch_enable")])
def test_dynamic_batching_before_0_11_1_is_the_declared_micro_batch_mean(
        engine_reads, grpo, tmp_path, version, flag):
    """Before 0.11.1 dynamic batching scales each micro-batch's token mean by its share of the
    step's samples, as gradient accumulation weighs micro-batches of one size: the
    token_mean_per_micro_batch deviation every run of these releases declares, which says so.
    The release's own code is read for the scale (the wheels' replay buffer and actor)."""
    zero = "--zero_stage" if flag == "--use_dynamic_batch" else "--ds.zero_stage"
    read = engine_reads(_plan(grpo, "openrlhf", version, tmp_path, {flag: True, zero: 3}))
    assert (read[flag], read[zero]) == (True, 3)
    deviation = _dialect("openrlhf", version).deviations["token_mean_per_micro_batch"]
    assert flag in deviation.description and "share of the step's samples" in \
        deviation.description
    wheels = os.environ.get("STATESET_TEST_OPENRLHF_WHEELS")
    if wheels is None:
        pytest.skip(OPENRLHF_WHEELS_MISSING)
    read = wheel_reader(next(Path(wheels).glob(f"openrlhf-{version}-*.whl")))
    buffer, actor = read("openrlhf/trainer/ppo_utils/replay_buffer.py"), \
        read("openrlhf/trainer/ray/ppo_actor.py")
    assert buffer is not None and actor is not None
    assert "loss_scale = [len(partition) / sample_num for partition in partitions]" in buffer
    assert "loss = loss * self.replay_buffer.dynamic_loss_scale[step]" in actor


@pytest.mark.parametrize(("version", "flag", "zero"), [
    ("0.9.8", "--use_dynamic_batch", "--zero_stage"),
    ("0.10.2", "--train.dynamic_batch_enable", "--ds.zero_stage"),
    ("0.11.2", "--train.dynamic_batch_enable", "--ds.zero_stage")])
def test_dynamic_batching_needs_zero_3(grpo, tmp_path, version, flag, zero):
    """With dynamic batching OpenRLHF leaves DeepSpeed one accumulation step and steps after
    several backward passes: ZeRO-1/2 then keep only the last micro-batch's gradient. The
    launch's own stage (2) refuses it, naming the stage; 3 plans; switching it off needs
    nothing."""
    with pytest.raises(InvalidInput, match=f"needs {zero} to be 3 \\(it is 2\\)"):
        _plan(grpo, "openrlhf", version, tmp_path, {flag: True})
    with pytest.raises(InvalidInput, match="it is 1"):
        _plan(grpo, "openrlhf", version, tmp_path, {flag: True, zero: 1})
    _plan(grpo, "openrlhf", version, tmp_path, {flag: False})


def test_a_requirement_holds_for_what_the_engine_reads():
    """However an option reaches a default that requires another key (its exact key, a
    mapping above it), and however the required key is given, the check is on the values the
    engine reads; leaving the default at the launch's own value requires nothing."""
    declared = {"policy.dyn.enabled": ExecutionDefault("packs by tokens", None,
                                                       (("policy.zero", (3,)),), "sums at 3"),
                "policy.zero": ExecutionDefault("partitions", (1, 2, 3))}
    own = {"policy.dyn.enabled": False, "policy.zero": 2}
    said = unmet({"policy.dyn.enabled": True}, own, declared)
    assert said == "policy.dyn.enabled: True needs policy.zero to be 3 (it is 2): sums at 3"
    assert unmet({"policy.dyn": {"enabled": True}}, own, declared) == said
    assert unmet({"policy.dyn": {"enabled": True}, "policy.zero": 3}, own, declared) is None
    assert unmet({"policy": {"zero": 3}, "policy.dyn.enabled": True}, own, declared) is None
    assert unmet({"policy.dyn.enabled": False, "policy.zero": 1}, own, declared) is None
    # a required key neither the options nor the launch set is the release's default
    assert unmet({"policy.dyn.enabled": True}, {}, declared) == (
        "policy.dyn.enabled: True needs policy.zero to be 3 (the launch leaves it at the "
        "release's default): sums at 3")
    # where the release's own default is known, it is what the engine reads
    assert unmet({"policy.dyn.enabled": True}, {}, declared, {"policy.zero": 3}) is None
    assert unmet({"policy.dyn.enabled": True}, {}, declared, {"policy.zero": 2}) == (
        "policy.dyn.enabled: True needs policy.zero to be 3 (it is 2, the release's "
        "default): sums at 3")
    # the launch's own values are read the same ways: force-added, or inside a mapping
    for spelled in ({"++policy.dyn.enabled": False, "++policy.zero": 2},
                    {"policy": {"dyn": {"enabled": False}, "zero": 2}}):
        assert unmet({"policy.dyn.enabled": True}, spelled, declared) == said
        assert unmet({"policy.dyn.enabled": False}, spelled, declared) is None


def test_vllm_engines_fill_colocated_gpus(engine_reads, grpo, tmp_path):
    assert engine_reads(_plan(grpo, "openrlhf", "0.11.2", tmp_path))["--vllm.num_engines"] == 1
    colocated = {"--train.colocate_all": True, "--vllm.tensor_parallel_size": 2}
    assert engine_reads(_plan(grpo, "openrlhf", "0.11.2", tmp_path, colocated))[
        "--vllm.num_engines"] == 4
    mine = {**colocated, "--vllm.num_engines": 2}
    assert engine_reads(_plan(grpo, "openrlhf", "0.11.2", tmp_path, mine))[
        "--vllm.num_engines"] == 2


def test_nemo_rl_validation_batches_still_cover_every_row(engine_reads, grpo, tmp_path):
    plain = engine_reads(_plan(grpo, "nemo-rl", "0.7.0", tmp_path))
    rows = plain["grpo.val_batch_size"]
    assert plain["grpo.max_val_samples"] == rows and plain["policy.dtensor_cfg._v2"] is True
    read = engine_reads(_plan(grpo, "nemo-rl", "0.7.0", tmp_path,
                       {"grpo.val_batch_size": 3, "policy.dtensor_cfg._v2": False}))
    assert read["grpo.val_batch_size"] == 3 and read["policy.dtensor_cfg._v2"] is False
    assert read["grpo.max_val_samples"] % 3 == 0
    assert rows <= read["grpo.max_val_samples"] < rows + 3


@pytest.mark.parametrize("option", [{"grpo.batch_multiplier": 3},
                                    {"grpo.reward_scaling.enabled": True},
                                    {"grpo.max_val_samples": 4}])
def test_nemo_rl_math_and_owned_keys_stay_guarded(grpo, tmp_path, option):
    with pytest.raises(InvalidInput, match=r"engine_options\.nemo-rl\."):
        _plan(grpo, "nemo-rl", "0.7.0", tmp_path, option)


def test_a_mapping_set_whole_opens_only_its_declared_part():
    execution = execution_defaults(type("D", (), {"name": "d", "keys": {"execution": {
        "a.k.c": "compiler options only change how the same model runs"}}})())
    taken = {"a.k": {}, "a.other": 1}
    assert reached("a.k", {"c": {"x": 1}}, taken, execution, option_conflict) is None
    assert reached("a.k.c.x", 1, taken, execution, option_conflict) is None
    assert reached("a.k", {"c": 1, "d": 2}, taken, execution, option_conflict) == "a.k"
    assert reached("a", {"k": {"c": 1}}, taken, execution, option_conflict) == "a.k"
    assert reached("~a.k.c", None, taken, execution, option_conflict) == "a.k"


def test_a_default_limited_to_values_holds_them_through_a_mapping():
    """A value-limited default reached inside a mapping the launch sets whole, or a key
    under it, is held to its values as the key itself is."""
    execution = execution_defaults(type("D", (), {"name": "d", "keys": {"execution": {
        "cfg.stage": {"reason": "stages only partition state across ranks",
                      "values": [1, 2, 3]}}}})())
    taken = {"cfg": {"stage": 2, "math": 0.5}}
    assert reached("cfg", {"stage": 3}, taken, execution, option_conflict) is None
    assert reached("cfg", {"stage": 0}, taken, execution, option_conflict) == "cfg"
    assert reached("cfg.stage.x", 1, taken, execution, option_conflict) == "cfg"


@pytest.mark.parametrize(("engine", "version", "option", "words"), [
    ("openrlhf", "0.10.2", {"--train.micro_batch_size": 0}, "a whole number of at least 1"),
    ("openrlhf", "0.10.2", {"--rollout.micro_batch_size": True}, "takes one int"),
    ("nemo-rl", "0.7.0", {"policy.dtensor_cfg._v2": {"x": 1}}, "a switch"),
])
def test_an_execution_default_keeps_its_kind(grpo, tmp_path, engine, version, option, words):
    """A size of 0 or a mapping where a switch belongs plans nothing the engine can start."""
    with pytest.raises(InvalidInput, match=words):
        _plan(grpo, engine, version, tmp_path, option)


def test_an_option_over_a_key_a_spec_setting_sets_is_refused_though_declared(grpo):
    """A contract that declares a key a spec setting sets an execution default (the mini-batch
    count as "memory only") cannot open it: the setting owns the key, and an option over it
    would change the experiment outside its identity. A key a non-identity section sets
    (resources) stays open where declared."""
    from stateset_echo_engine.plugin import EchoAdapter

    from stateset_backend.contracts.loader import Contract
    from stateset_backend.translate.rules import to, translate

    doc = EchoAdapter().contract.to_json()
    doc["dialects"][0]["keys"]["execution"] = {
        "budget.mini_batches": {"reason": "micro-batches: memory only"},
        "resources.gpus_per_node": {"reason": "placement"}}
    dialect = Contract.model_validate(doc).dialect(parse_version("1.2.0"))
    rules = {**EchoAdapter().rules(dialect),
             "resources.gpus_per_node": to("resources.gpus_per_node")}

    def options(**given: Any) -> ExperimentSpec:
        return ExperimentSpec.model_validate({**grpo, "engine_options": {"echo": given}})

    with pytest.raises(InvalidInput, match=r"overrides the key that budget\.mini_batches pins"):
        translate(options(**{"budget.mini_batches": 2}), rules, dialect, "echo", "1.2.0")
    own = translate(options(), rules, dialect, "echo", "1.2.0")
    taken = translate(options(**{"resources.gpus_per_node": 4}), rules, dialect, "echo",
                      "1.2.0")
    assert own.sources["resources.gpus_per_node"] == "resources.gpus_per_node"
    assert (own.native["resources.gpus_per_node"], taken.native["resources.gpus_per_node"]) \
        == (grpo["resources"]["gpus_per_node"], 4)


def test_a_declared_value_list_holds_where_the_launch_leaves_the_key_unset(grpo):
    """An execution default safe only at some values is refused at another even where the
    launch leaves the key at the release's default (it sets it only when an option does)."""
    from stateset_echo_engine.plugin import EchoAdapter

    from stateset_backend.contracts.loader import Contract
    from stateset_backend.translate.rules import translate

    doc = EchoAdapter().contract.to_json()
    doc["dialects"][0]["keys"]["execution"] = {
        "--grad-accum": {"reason": "micro-batches: memory only", "values": [1, 2, 4]}}
    dialect = Contract.model_validate(doc).dialect(parse_version("1.2.0"))
    rules = EchoAdapter().rules(dialect)

    def planned(value: int) -> Any:
        spec = ExperimentSpec.model_validate(
            {**grpo, "engine_options": {"echo": {"--grad-accum": value}}})
        return translate(spec, rules, dialect, "echo", "1.2.0")

    assert planned(4).native["--grad-accum"] == 4
    with pytest.raises(InvalidInput, match=r"--grad-accum: 0 is not one of the values"):
        planned(0)
