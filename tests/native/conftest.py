"""Tiny native-engine specs over the bundled support-routing data, and in-process trainers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def tiny_spec(**changes: Any) -> dict[str, Any]:
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    for split in ("train", "validation", "test"):
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    doc["reward"]["entrypoint"] = str(EXAMPLES / doc["reward"]["entrypoint"])
    doc["algorithm"] = {"objective": "grpo", "group_size": 4,
                        "kl": {"coef": 0.01, "estimator": "k3", "placement": "loss"}}
    doc["data"]["max_response_tokens"] = 2
    doc["data"]["chat_template"] = False  # the built-in tiny tokenizer ships no chat template
    doc["budget"] = {"total_updates": 6, "prompts_per_update": 4, "ppo_epochs": 2,
                     "mini_batches": 2}
    doc["checkpoint"] = {"every": 2, "keep": None}
    doc["evaluation"] = {"every": 3, "select_by": "val/reward/mean"}
    doc["optim"]["warmup_steps"] = 2
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = copy.deepcopy(value)
    return doc


@pytest.fixture
def tiny():
    return tiny_spec


@pytest.fixture
def spec_file(tmp_path):
    """Write a spec anywhere: tiny specs use absolute paths."""

    def write(doc: dict[str, Any]) -> Path:
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(doc))
        return path

    return write


@pytest.fixture
def make_trainer(tmp_path):
    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec

    def make(doc: dict[str, Any], out: str = "out") -> Trainer:
        spec = parse_spec(doc)
        settings = RunSettings("20260101T000000Z-00000000", experiment_digest(spec), spec,
                               EXAMPLES)
        (tmp_path / out).mkdir(exist_ok=True)
        return Trainer(settings, tmp_path / out)

    return make


def signal_reward(directory: Path) -> dict[str, Any]:
    """A reward section whose score differs between the samples of a group (the parity of the
    response's characters), for tests that need every update to have a learning signal whatever
    the tiny random model samples: the task reward is 0 for nearly every sample, so whether an
    early update moves the weights would otherwise depend on the luck of the draw."""
    from stateset_backend.spec.content import sha256_file

    path = directory / "parity_reward.py"
    path.write_text("def score(prompt, response, answer):\n"
                    "    return float(sum(map(ord, response)) % 2)\n")
    return {"kind": "python", "entrypoint": f"{path}:score", "sha256": sha256_file(path)}
