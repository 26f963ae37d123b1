"""The realistic external-engine examples plan on a machine where no engine is installed, and
a spec an engine version cannot honour exits 3 naming what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "external"

# (example, engine, version) -> None when it plans, else a fragment of the exit-3 message
EXPECTED = {
    ("grpo", "verl", "0.9.1"): None,
    ("grpo", "verl", "0.6.0"): None,
    ("grpo", "openrlhf", "0.11.2"): None,
    ("grpo", "openrlhf", "0.9.10"): None,
    ("dapo", "verl", "0.9.1"): None,
    ("dapo", "verl", "0.7.0"): "dynamic_sampling (available in verl >=0.9)",
    ("gspo", "verl", "0.9.1"): None,
    ("gspo", "verl", "0.5.0"): "objective:gspo (available in verl >=0.6",
    ("gspo", "openrlhf", "0.11.2"): None,
    ("gspo", "openrlhf", "0.9.10"): "objective:gspo (available in openrlhf >=0.11.2)",
    ("cispo", "verl", "0.9.1"): None,
    ("cispo", "verl", "0.6.0"): "objective:cispo (available in verl >=0.7)",
    ("cispo", "openrlhf", "0.11.2"): "objective:cispo (not available in any openrlhf version)",
    ("grpo", "nemo-rl", "0.7.0"): None,
    ("grpo", "nemo-rl", "0.5.0rc0"): None,
    ("dapo", "nemo-rl", "0.7.0"): None,
    ("gspo", "nemo-rl", "0.6.0"): None,
    ("cispo", "nemo-rl", "0.7.0"): None,
    ("cispo", "nemo-rl", "0.6.0"): "objective:cispo (available in nemo-rl >=0.7.0",
}


@pytest.mark.parametrize("example, engine, version", sorted(EXPECTED))
def test_plan_or_refuse(cli, tmp_path, example, engine, version):
    plan = tmp_path / "plan.json"
    proc = cli("plan", "--engine", engine, "--engine-version", version,
               EXAMPLES / f"{example}.json", "-o", plan)
    missing = EXPECTED[(example, engine, version)]
    if missing is None:
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(plan.read_text())
        assert doc["engine_version"] == version and doc["argv"]
    else:
        assert proc.returncode == 3 and missing in proc.stderr, proc.stderr
        assert not plan.exists()


@pytest.mark.parametrize("example", ["grpo", "dapo", "gspo", "cispo"])
def test_examples_pin_model_data_and_reward(cli, example):
    doc = json.loads((EXAMPLES / f"{example}.json").read_text())
    assert len(doc["model"]["revision"]) == 40
    assert cli("validate", EXAMPLES / f"{example}.json").returncode == 0
