"""algorithm.rollout_correction: the sampler/learner importance weight, expressed once and
carried only where an engine's own code computes the same weight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.common.errors import Unsupported
from stateset_backend.contracts.capabilities import required_capabilities
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.registry import build_registry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.digest import experiment_digest, identity_document
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.rules import explain_rows

MASK = {"mode": "mask", "low": 0.25, "high": 4.0}


def _with(doc: dict[str, Any], correction: Any, **alg: Any) -> dict[str, Any]:
    return {**doc, "algorithm": {**doc["algorithm"], **alg, "rollout_correction": correction}}


def _plan(doc: dict[str, Any], engine: str, version: str, base: Path) -> Any:
    return make_plan(ExperimentSpec.model_validate(doc), build_registry().get(engine),
                     version, base_dir=base)


def test_null_leaves_the_digest_and_the_identity_as_they_were(grpo):
    plain = ExperimentSpec.model_validate(grpo)
    null = ExperimentSpec.model_validate(_with(grpo, None))
    assert "rollout_correction" not in identity_document(plain)["experiment"]["algorithm"]
    assert experiment_digest(null) == experiment_digest(plain)
    on = ExperimentSpec.model_validate(_with(grpo, MASK))
    assert experiment_digest(on) != experiment_digest(plain)
    assert ExperimentSpec.model_validate(_with(grpo, {"mode": "truncate"})) \
        .algorithm.rollout_correction.model_dump() == {  # type: ignore[union-attr]
            "mode": "truncate", "low": 0.5, "high": 5.0}


@pytest.mark.parametrize("mode", ["truncate", "mask", "sequence_mask"])
def test_its_capability_is_required(grpo, mode):
    spec = ExperimentSpec.model_validate(_with(grpo, {"mode": mode}))
    assert f"rollout_correction:{mode}" in required_capabilities(spec)
    assert not any(c.startswith("rollout_correction:")
                   for c in required_capabilities(ExperimentSpec.model_validate(grpo)))


def test_sft_refuses_it(grpo):
    doc = {**grpo, "algorithm": {"objective": "sft", "rollout_correction": MASK},
           "budget": {**grpo["budget"], "ppo_epochs": 1, "mini_batches": 1}}
    with pytest.raises(ValueError, match="rollout_correction applies to RL objectives"):
        ExperimentSpec.model_validate(doc)


# one release of each dialect, read back by that release's own argparse
@pytest.mark.parametrize(("version", "expected"), [
    ("0.9.8", {"--enable_vllm_is_correction": True, "--vllm_is_correction_type": "icepop",
               "--vllm_is_truncated_threshold": [0.25, 4.0]}),
    ("0.10.2", {"--algo.advantage.is_correction_enable": True,
                "--algo.advantage.is_correction_type": "icepop",
                "--algo.advantage.is_correction_threshold": [0.25, 4.0]}),
    ("0.11.2", {"--algo.advantage.is_correction_level": "token",
                "--algo.advantage.is_correction_mode": "mask",
                "--algo.advantage.is_correction_gating": "ratio",
                "--algo.advantage.is_correction_threshold": [0.25, 4.0]}),
])
def test_openrlhf_reads_the_correction_back(engine_reads, grpo, tmp_path, version, expected):
    read = engine_reads(_plan(_with(grpo, MASK), "openrlhf", version, tmp_path))
    assert {k: read[k] for k in expected} == expected
    off = engine_reads(_plan(grpo, "openrlhf", version, tmp_path))
    switch = next(iter(expected))
    assert off.get(switch) in (None, False, "off")  # a store_true flag left out is off


@pytest.mark.parametrize(("mode", "level", "kind"), [
    ("truncate", "token", "clip"), ("sequence_mask", "seq", "mask")])
def test_openrlhf_0_11_2_levels_and_modes(engine_reads, grpo, tmp_path, mode, level, kind):
    read = engine_reads(_plan(_with(grpo, {"mode": mode}), "openrlhf", "0.11.2", tmp_path))
    assert read["--algo.advantage.is_correction_level"] == level
    assert read["--algo.advantage.is_correction_mode"] == kind


def test_openrlhf_refuses_it_for_gspo(grpo, tmp_path):
    doc = _with(grpo, MASK, objective="gspo", ratio_level="sequence")
    with pytest.raises(Unsupported, match="GSPO does not weight its loss"):
        _plan(doc, "openrlhf", "0.11.2", tmp_path)


@pytest.mark.parametrize(("engine", "reason"), [
    ("verl", "modes of its own"), ("nemo-rl", "weights the KL term"),
    ("trl", "keeps no sampler log-probs")])
def test_other_engines_refuse_it(grpo, engine, reason):
    adapter = build_registry().get(engine).adapter
    for dialect in adapter.contract.dialects:
        rows = explain_rows(ExperimentSpec.model_validate(_with(grpo, MASK)),
                            adapter.rules(dialect), dialect, engine)
        mine = [r for r in rows if r.path.startswith("algorithm.rollout_correction.")]
        assert mine and all(r.state == "refused" and reason in r.reason for r in mine)
        rows = explain_rows(ExperimentSpec.model_validate(grpo), adapter.rules(dialect),
                            dialect, engine)
        assert [r.state for r in rows if r.path == "algorithm.rollout_correction"] == \
            ["pinned"]


def test_a_plugin_without_a_rule_refuses_it_and_ignores_it_unset(grpo):
    adapter = build_registry().get("openrlhf").adapter
    dialect = adapter.contract.dialect(parse_version("0.11.2"))
    rules = {k: v for k, v in adapter.rules(dialect).items()
             if not k.startswith("algorithm.rollout_correction")}
    rows = explain_rows(ExperimentSpec.model_validate(_with(grpo, MASK)), rules, dialect,
                        "a plugin")
    refused = {r.path: r.reason for r in rows if r.path.startswith("algorithm.rollout_corr")}
    assert set(refused) == {f"algorithm.rollout_correction.{k}" for k in ("mode", "low", "high")}
    assert all("predates algorithm.rollout_correction" in r for r in refused.values())
    rows = explain_rows(ExperimentSpec.model_validate(grpo), rules, dialect, "a plugin")
    assert [r.state for r in rows if r.path == "algorithm.rollout_correction"] == ["inert"]


@pytest.mark.parametrize(("bad", "message"), [
    ({"mode": "mask", "low": 2.0, "high": 1.0}, "must not exceed"),
    ({"mode": "clip"}, "rollout_correction.mode"),
    ({"mode": "mask", "high": 0}, "rollout_correction.high")])
def test_bad_values_are_one_line_exit_2(grpo, tmp_path, cli_in_process, bad, message):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_with(grpo, bad)))
    result = cli_in_process("validate", path)
    assert result.returncode == 2
    assert message in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("version", "flags", "mode"), [
    ("0.10.2", ["--algo.advantage.is_correction_enable",
                "--algo.advantage.is_correction_type", "icepop"], "mask"),
    ("0.11.2", ["--algo.advantage.is_correction_level", "token",
                "--algo.advantage.is_correction_mode", "clip"], "truncate"),
])
def test_an_imported_threshold_pair_keeps_both_bounds(tmp_path, version, flags, mode):
    """The engine reads ``low high`` as one pair, so neither bound alone reproduces it: the
    import moves both at once, whichever differs from the defaults."""
    from stateset_backend.importing.launch import import_file

    script = tmp_path / "run.sh"
    script.write_text(" ".join([
        "python3 -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path Qwen/Qwen2.5-7B",
        "--data.prompt_dataset d.jsonl --rollout.batch_size 32",
        "--rollout.n_samples_per_prompt 4 --train.batch_size 64",
        "--algo.advantage.estimator group_norm", *flags,
        "--algo.advantage.is_correction_threshold 0.3 3"]) + "\n")
    doc = import_file(build_registry(), "openrlhf", script, version).to_json()
    assert doc["spec"]["algorithm"]["rollout_correction"] == {"mode": mode, "low": 0.3,
                                                              "high": 3.0}
    fates = {s["key"]: s for s in doc["settings"]}
    assert fates["--algo.advantage.is_correction_threshold"]["reproduced"] is True
