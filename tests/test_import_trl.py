"""`import trl`: a GRPOConfig file as `trl grpo --config` reads it becomes a spec, read back
through the TRL plugin's own launch reader."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("stateset_trl_engine")

CONFIG = """\
model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
dataset_name: data/train.jsonl
reward_funcs: [accuracy_reward]
learning_rate: 1.0e-6
num_generations: 8
per_device_train_batch_size: 8
max_completion_length: 256
beta: 0.04
epsilon_high: 0.28
max_steps: 50
seed: 7
gradient_checkpointing: true
report_to: wandb
output_dir: Qwen2.5-0.5B-GRPO
"""


def test_a_grpo_config_file(tmp_path, cli_in_process):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "p", "answer": "a"}\n' * 16)
    config = tmp_path / "grpo.yaml"
    config.write_text(CONFIG)
    proc = cli_in_process("import", "trl", config, "--engine-version", "1.16.0", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    spec = doc["spec"]
    assert spec["algorithm"]["group_size"] == 8
    assert spec["algorithm"]["clip"]["high"] == 0.28
    assert spec["algorithm"]["kl"]["coef"] == 0.04
    assert spec["optim"]["lr"] == 1e-6
    assert spec["budget"]["total_updates"] == 50
    assert spec["seed"] == 7
    assert spec["model"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert spec["data"]["train"]["sha256"] != "0" * 64
    fates = {s["key"]: s for s in doc["settings"]}
    assert fates["num_generations"]["spec_field"] == "algorithm.group_size"
    assert fates["output_dir"]["hub_owned"] is True
    assert any("reward_funcs" in r["given_as"] for r in doc["refused"])
    trip = doc["round_trip"]
    assert trip["settings"] == len(doc["settings"]) + len(doc["refused"])


def test_a_key_trl_does_not_have_is_exit_2(tmp_path, cli_in_process):
    config = tmp_path / "grpo.yaml"
    config.write_text("learning_rate: 1.0e-6\nnum_generation: 8\n")
    proc = cli_in_process("import", "trl", config, "--engine-version", "1.16.0")
    assert proc.returncode == 2 and "num_generation" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    assert cli_in_process("import", "trl", listing, "--engine-version", "1.16.0").returncode == 2
