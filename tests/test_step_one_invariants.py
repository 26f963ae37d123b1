"""The step-1 invariants, observed in what each engine that runs here logs through the hub:
while the policy still equals the reference (update 1 with one optimizer step), the KL to
the reference is exactly 0; by update 2 the policy has moved, so it is not (a check that
cannot fail would hold there too); every metric is finite; every planned update commits.

A KL reference built in another precision or from other weights than the policy (verl's
bf16 reference under a float32 spec did exactly that) shows here as a non-zero first KL.
Rollout log-probs against the learner's recompute are held in tests/native/test_rollout.py
for the native engine and in tests/engines/test_verl_rehearsal.py for verl."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from optional_installs import TRL_PLUGIN_MISSING, trl_plugin_installed

from stateset_backend.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# TRL's GRPOTrainer estimates the KL with k3 only
CASES = [("native", "k1"), ("native", "k3"), pytest.param("trl", "k3", marks=pytest.mark.skipif(
    not trl_plugin_installed(), reason=TRL_PLUGIN_MISSING))]


def _spec(folder: Path, estimator: str) -> Path:
    shutil.copytree(EXAMPLES / "support-routing", folder / "support-routing")
    doc: dict[str, Any] = json.loads((EXAMPLES / "support-routing.json").read_text())
    doc["budget"].update(total_updates=3, ppo_epochs=1, mini_batches=1)
    doc["algorithm"]["kl"] = {"coef": 0.01, "estimator": estimator, "placement": "loss"}
    doc["optim"]["warmup_steps"] = 0  # update 1 moves the policy, so update 2's KL is not 0
    path = folder / "spec.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("engine, estimator", CASES)
def test_the_first_update_sees_no_kl_and_the_second_does(capsys, tmp_path, engine, estimator):
    spec = _spec(tmp_path, estimator)
    code = main(["run", "--engine", engine, "--runs-dir", str(tmp_path / "runs"), "--json",
                 str(spec)])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert result["status"] == "succeeded" and result["committed_updates"] == 3
    metrics = tmp_path / "runs" / result["run_id"] / "attempts" / "1" / \
        "canonical_metrics.jsonl"
    rows = {row["step"]: row for row in map(json.loads, metrics.read_text().splitlines())}
    assert rows[1]["kl"] == 0.0, rows[1]
    assert rows[2]["kl"] != 0.0, rows[2]  # k1 (the plain log-ratio) may be negative
    for row in rows.values():
        assert all(math.isfinite(v) for k, v in row.items()
                   if isinstance(v, float)), row
