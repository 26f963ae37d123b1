"""`import` on the engines' own published launch scripts (verl's and OpenRLHF's example
folders, copied unchanged from a release the contracts know): every setting is accounted for
with its reason, and the share the imported spec's plan reproduces does not fall."""

from __future__ import annotations

from pathlib import Path

import pytest

from stateset_backend.engines.registry import build_registry
from stateset_backend.importing.launch import import_file

RECIPES = Path(__file__).parent.parent / "examples" / "recipes"
VERL = RECIPES / "verl-v0.7.0" / "examples"
OPENRLHF = RECIPES / "openrlhf-v0.10.2" / "examples" / "scripts"

# (engine, release, script, the share of the launch's own settings reproduced, leaving out the
# run's names, output folders and loggers): what each round trip measured when it was shipped.
# What stays below 100% is named on the import screen: the script's own arguments ("$@"),
# two files joined into one split, and OpenRLHF's switches that change the math (importance
# correction, reward normalisation, asynchronous training); its memory, speed and placement settings
# (dynamic batching included) are execution defaults, kept in engine_options.
CASES = [
    ("verl", "0.7.0", VERL / "grpo_trainer" / "run_qwen2-7b.sh", 97.2),
    ("verl", "0.7.0", VERL / "grpo_trainer" / "run_qwen2-7b_math.sh", 91.7),
    ("verl", "0.7.0", VERL / "grpo_trainer" / "run_deepseek7b_llm.sh", 97.2),
    ("verl", "0.7.0", VERL / "grpo_trainer" / "run_qwen3-8b.sh", 97.2),
    ("verl", "0.7.0", VERL / "grpo_trainer" / "run_qwen2_5-3b_gsm8k_grpo_lora.sh", 97.6),
    ("verl", "0.7.0", VERL / "ppo_trainer" / "run_gemma.sh", 97.2),
    ("verl", "0.7.0", VERL / "ppo_trainer" / "run_deepseek7b_llm.sh", 97.4),
    ("openrlhf", "0.10.2", OPENRLHF / "train_ppo_ray_hybrid_engine.sh", 94.9),
    ("openrlhf", "0.10.2", OPENRLHF / "train_dapo_ray_hybrid_engine.sh", 95.1),
    ("openrlhf", "0.10.2", OPENRLHF / "train_ppo_with_reward_fn.sh", 90.6),
    ("openrlhf", "0.10.2", OPENRLHF / "train_reinforce_baseline_hybrid_engine.sh", 100.0),
    ("openrlhf", "0.10.2", OPENRLHF / "train_prorlv2_math_hybrid_engine.sh", 93.9),
    ("openrlhf", "0.10.2", OPENRLHF / "train_reinforce_baseline_ray_agent_async.sh", 96.3),
    ("openrlhf", "0.10.2", OPENRLHF / "train_vlm_math_hybrid_engine.sh", 95.2),
]


@pytest.mark.parametrize(("engine", "version", "script", "floor"), CASES,
                         ids=[f"{c[0]}-{c[2].name}" for c in CASES])
def test_a_published_script_round_trips(engine, version, script, floor):
    doc = import_file(build_registry(), engine, script, version).to_json()
    trip = doc["round_trip"]
    assert "error" not in trip, trip.get("error")
    assert trip["settings"] == len(doc["settings"]) + len(doc["refused"])
    assert trip["experiment_percent"] >= floor
    for setting in doc["settings"]:
        if not setting["reproduced"]:
            assert setting["reason"], setting["key"]
    assert all(word["reason"] for word in doc["refused"])
    # a name, a folder or a logger is the hub's only where its plan writes a text of its own
    for setting in doc["settings"]:
        if setting.get("hub_owned"):
            assert not setting["reproduced"] and setting["planned"] is not None


def test_verl_ppo_scripts_without_kl_import_without_kl():
    """verl's PPO examples switch KL off in both places; the spec has no KL section, rather
    than a KL in the reward at the release's default coefficient."""
    doc = import_file(build_registry(), "verl", VERL / "ppo_trainer" / "run_gemma.sh",
                      "0.7.0").to_json()
    assert doc["spec"]["algorithm"]["kl"] is None
    assert doc["spec"]["algorithm"]["objective"] == "ppo"


def test_a_zero_kl_coefficient_imports_as_no_kl():
    """No KL flag changes what OpenRLHF computes at a zero coefficient (no reference model,
    every KL term zeros): the VLM script's `--algo.kl.init_coef 0 --algo.kl.use_loss
    --algo.kl.estimator k2` is a spec without KL, and the two inert flags count as
    reproduced."""
    doc = import_file(build_registry(), "openrlhf",
                      OPENRLHF / "train_vlm_math_hybrid_engine.sh", "0.10.2").to_json()
    assert doc["spec"]["algorithm"]["kl"] is None
    fates = {s["key"]: s for s in doc["settings"]}
    assert fates["--algo.kl.init_coef"]["reproduced"] is True
    for key in ("--algo.kl.use_loss", "--algo.kl.estimator"):
        assert fates[key]["reproduced"] is True, key
        assert fates[key]["planned"] != fates[key]["value"], key
        assert "changes nothing where --algo.kl.init_coef is 0" in fates[key]["reason"], key


def test_home_is_read_as_this_users_home():
    """``$HOME/data/...`` is the launching user's home, as ``~`` is: the split's path is that
    file, a placeholder digest until the file is there."""
    doc = import_file(build_registry(), "verl", VERL / "grpo_trainer" / "run_qwen2-7b.sh",
                      "0.7.0").to_json()
    train = doc["spec"]["data"]["train"]
    assert train["uri"] == str(Path.home() / "data" / "gsm8k" / "train.parquet")
    assert train["sha256"] == "0" * 64
    fates = {s["key"]: s for s in doc["settings"]}
    assert fates["data.train_files"]["reproduced"] is True


@pytest.mark.parametrize("folder", ["verl-v0.7.0", "openrlhf-v0.10.2"])
def test_shipped_scripts_carry_their_source_and_licence(folder):
    readme = (RECIPES / folder / "README.md").read_text(encoding="utf-8")
    assert "https://github.com/" in readme and "Apache License 2.0" in readme
    assert "Apache License" in (RECIPES / folder / "LICENSE").read_text(encoding="utf-8")
