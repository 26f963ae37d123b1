"""`import nemo-rl`: a NeMo RL config (with the configs it extends) and overrides, read as NeMo
RL reads them, becomes a spec whose plan reproduces them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stateset_backend.engines.registry import build_registry
from stateset_backend.importing.launch import import_file
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec

RECIPES = Path(__file__).parent.parent / "examples" / "recipes"
SHIPPED = RECIPES / "nemo-rl-v0.7.0"


def test_the_recipe_round_trips_through_its_own_launch(tmp_path):
    """The recipe's plan as a config plus its overrides, the way NeMo RL is launched: the
    imported spec is the recipe's experiment, and its plan reproduces every setting but the
    run's name and the reward file's digest (the file is not where the config says)."""
    registry = build_registry()
    recipe = load_spec(RECIPES / "nemo-rl-grpo_math_1B.json")
    plan = make_plan(recipe, registry.get("nemo-rl"), "0.7.0", base_dir=RECIPES)
    overrides = [a for a in plan.argv if "=" in a and not a.startswith("-")]
    config = tmp_path / "grpo.yaml"
    config.write_text("defaults: grpo_math_1B.yaml\ngrpo:\n  seed: 42\n")
    imported = import_file(registry, "nemo-rl", config, "0.7.0", overrides)
    doc = imported.to_json()
    missed = {s["key"] for s in doc["settings"] if not s["reproduced"]}
    assert missed == {"logger.wandb.name", "env.stateset_reward.sha256"}
    assert doc["round_trip"]["percent"] >= 95.0
    want = recipe.model_dump(mode="json")
    for section in ("optim", "budget", "rollout", "checkpoint", "resources", "seed"):
        assert imported.spec[section] == want[section], section
    assert imported.spec["algorithm"]["objective"] == "rloo"
    assert imported.spec["evaluation"]["every"] == want["evaluation"]["every"]
    assert any("validation" in line for line in doc["inputs"])


def test_a_shipped_recipe_reads_through_its_parents():
    """A recipe of NeMo RL's own examples, its parent recipe the release's (the hub's surface
    of it, since the parent file is not shipped): every setting is accounted for, and all but
    the run's names, output folders and what the spec cannot carry are reproduced."""
    path = SHIPPED / "recipes" / "llm" / "grpo-deepscaler-1.5b-16K.yaml"
    doc = import_file(build_registry(), "nemo-rl", path, "0.7.0").to_json()
    trip = doc["round_trip"]
    assert trip["settings"] == len(doc["settings"]) + len(doc["refused"])
    fates = {s["key"]: s for s in doc["settings"]}
    # what the spec cannot carry is named: NeMo RL's own dataset registry; the older DTensor
    # worker, the validation batch and vLLM's compiler options (inside the generation kwargs
    # the hub pins) are execution defaults, kept in engine_options and read back
    missed = {k for k, s in fates.items() if s["reproduced"] is False and not
              s.get("hub_owned")}
    assert missed == {"data.train.dataset_name", "data.validation.dataset_name",
                      "data.validation.repeat"}
    options = doc["spec"]["engine_options"]["nemo-rl"]
    assert options["policy.dtensor_cfg._v2"] is False and options["grpo.val_batch_size"] == 32
    assert set(options["policy.generation.vllm_kwargs"]) == {"compilation_config"}
    for key in ("grpo.val_batch_size", "policy.generation.vllm_kwargs.compilation_config.backend",
                "policy.generation.vllm_kwargs.compilation_config.custom_ops"):
        assert fates[key]["reproduced"] is True, key
    assert all(fates[k]["reason"] for k in missed)
    # a registry dataset leaves the spec's split a placeholder, and says which file to make
    assert "registry" in fates["data.train.dataset_name"]["reason"]
    assert any("'DeepScaler'" in line and "data.train.uri" in line for line in doc["inputs"])
    # only the run's names and folders are the hub's own
    assert all(isinstance(s["planned"], str) for s in doc["settings"] if s.get("hub_owned"))
    # the 16K recipe extends the 8K one, which extends the release's own recipe
    assert fates["policy.max_total_sequence_length"]["value"] == 16384
    assert fates["policy.model_name"]["spec_field"] == "model.path"
    assert any("parent" in note for note in doc["notes"])


def test_overrides_go_through_hydra_and_the_release_config(tmp_path, cli_in_process):
    config = tmp_path / "grpo.yaml"
    config.write_text("grpo:\n  num_generations_per_prompt: 8\n  num_prompts_per_step: 16\n")
    proc = cli_in_process("import", "nemo-rl", config, "--engine-version", "0.7.0",
               "--override", "loss_fn.ratio_clip_max=0.28", "--json")
    assert proc.returncode == 0, proc.stderr
    spec = json.loads(proc.stdout)["spec"]
    assert spec["algorithm"]["group_size"] == 8
    assert spec["budget"]["prompts_per_update"] == 16
    assert spec["algorithm"]["clip"]["high"] == 0.28
    bad = cli_in_process("import", "nemo-rl", config, "--engine-version", "0.7.0",
              "--override", "loss_fn.no_such_key=1")
    assert bad.returncode == 2 and "no such key" in bad.stderr


def test_a_yaml_that_is_not_nemo_rl_is_exit_2(tmp_path, cli_in_process):
    other = tmp_path / "other.yaml"
    other.write_text("model:\n  name: x\ntrainer:\n  epochs: 3\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("grpo: [1, 2\n")
    for path in (other, broken):
        proc = cli_in_process("import", "nemo-rl", path, "--engine-version", "0.7.0")
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo a=1\n")
    assert cli_in_process("import", "verl", script, "--override", "a=1").returncode == 2


def test_defaults_that_follow_another_key_are_kept_as_written():
    """NeMo RL's recipe writes vLLM's context length and the sequence divisor as
    interpolations of other keys; a recipe that sets them to the values they resolve to under
    its own settings keeps them, as engine options where the plan changes the keys they
    follow, as the release's defaults where it reproduces them."""
    path = SHIPPED / "recipes" / "llm" / \
        "grpo-llama3.2-1b-instruct-1n8g-fsdp2tp2-temp0.8-topp0.9-topk50.yaml"
    doc = import_file(build_registry(), "nemo-rl", path, "0.7.0").to_json()
    fates = {s["key"]: s for s in doc["settings"]}
    for key in ("policy.generation.vllm_cfg.max_model_len",
                "policy.make_sequence_length_divisible_by"):
        assert fates[key]["reproduced"], key
        kept = key in doc["spec"]["engine_options"].get("nemo-rl", {})
        assert kept == (fates[key]["fate"] == "engine_option"), key
    assert doc["round_trip"]["experiment_percent"] >= 94.0


# What each shipped recipe's round trip measured (the share of its own settings reproduced,
# leaving out the run's names and folders), as examples/recipes/nemo-rl-v0.7.0/README.md
# states it.
SHIPPED_FLOORS = {
    "grpo_smoke.yaml": 77.8,
    "recipes/llm/dapo-qwen2.5-7b.v2.yaml": 89.5,
    "recipes/llm/grpo-deepscaler-1.5b-16K.yaml": 88.9,
    "recipes/llm/grpo-deepscaler-1.5b-8K.yaml": 87.5,
    "recipes/llm/grpo-gemma3-1b-it-1n8g-fsdp2tp1.yaml": 100.0,
    "recipes/llm/grpo-gspo-deepscaler-1.5b-8K.yaml": 88.9,
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated.yaml": 100.0,
    "recipes/llm/grpo-llama3.2-1b-instruct-1n4g-fsdp2tp1.v3.yaml": 100.0,
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-fsdp2tp1.v3.yaml": 100.0,
    "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-fsdp2tp2-temp0.8-topp0.9-topk50.yaml": 100.0,
    "recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml": 100.0,
}


@pytest.mark.parametrize("recipe", sorted(SHIPPED_FLOORS))
def test_every_shipped_recipe_keeps_its_round_trip(recipe):
    doc = import_file(build_registry(), "nemo-rl", SHIPPED / recipe, "0.7.0").to_json()
    assert "error" not in doc["round_trip"]
    assert doc["round_trip"]["experiment_percent"] >= SHIPPED_FLOORS[recipe]
    assert all(s["reason"] for s in doc["settings"] if not s["reproduced"])


def test_a_validation_period_of_minus_one_is_never_as_zero_is():
    """NeMo RL validates on a period only where it is above 0, so the smoke recipe's -1 and
    the plan's 0 (no evaluation) are one setting, reproduced with the code's reason."""
    doc = import_file(build_registry(), "nemo-rl", SHIPPED / "grpo_smoke.yaml",
                      "0.7.0").to_json()
    period = next(s for s in doc["settings"] if s["key"] == "grpo.val_period")
    assert (period["value"], period["planned"]) == (-1, 0)
    assert period["reproduced"] is True
    assert "val_period > 0" in period["reason"] and "at most 0" in period["reason"]
    assert doc["spec"]["evaluation"]["every"] is None
