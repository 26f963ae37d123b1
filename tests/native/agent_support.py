"""Helpers for the conversation tests: the support-agent spec with absolute paths and small
budgets, environment files written on the fly, and an in-process trainer."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
AGENT_ENV = EXAMPLES / "support-agent" / "environment.py"


def agent_spec(**changes: Any) -> dict[str, Any]:
    doc = json.loads((EXAMPLES / "support-agent.json").read_text())
    for split in ("train", "validation", "test"):
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    doc["environment"]["entrypoint"] = str(EXAMPLES / doc["environment"]["entrypoint"])
    doc["algorithm"] = {"objective": "grpo", "group_size": 2,
                        "kl": {"coef": 0.01, "estimator": "k3", "placement": "loss"}}
    doc["budget"] = {"total_updates": 2, "prompts_per_update": 3, "ppo_epochs": 1,
                     "mini_batches": 1}
    doc["checkpoint"] = {"every": None, "keep": None}
    doc["evaluation"] = {"every": None}
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = doc
        for part in parents:
            node = node[part]
        node[last] = copy.deepcopy(value)
    return doc


def with_environment(doc: dict[str, Any], path: Path, class_name: str) -> dict[str, Any]:
    from stateset_backend.spec.content import sha256_file

    doc = copy.deepcopy(doc)
    doc["environment"]["entrypoint"] = f"{path}:{class_name}"
    doc["environment"]["sha256"] = sha256_file(path)
    return doc


def make_trainer(doc: dict[str, Any], out: Path) -> Any:
    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec

    spec = parse_spec(doc)
    out.mkdir(parents=True, exist_ok=True)
    return Trainer(RunSettings("20260101T000000Z-00000000", experiment_digest(spec), spec,
                               EXAMPLES), out)


# Environments that misbehave, each after a good reset. ``FAIL_ROW`` picks which task rows
# misbehave (the rest answer like the support agent would: one step, reward 1, done).
BAD_ENVIRONMENTS = '''
import os, time

class _Base:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"order": {"type": "string"}}}}}]

    def reset(self, task):
        self.bad = task["order"] == "o1"
        return [{"role": "user", "content": task["prompt"]}]

    def good(self):
        return {"observations": [], "reward": 1.0, "done": True}

class Raising(_Base):
    def step(self, messages):
        if self.bad:
            raise RuntimeError("the order database is down")
        return self.good()

class Down(_Base):
    def step(self, messages):
        raise RuntimeError("the order database is down")

class Hanging(_Base):
    def step(self, messages):
        if self.bad:
            time.sleep(3600)
        return self.good()

class NaNReward(_Base):
    def step(self, messages):
        return {"observations": [], "reward": float("nan") if self.bad else 1.0, "done": True}

class StringReward(_Base):
    def step(self, messages):
        return {"observations": [], "reward": "1.0" if self.bad else 1.0, "done": True}

class NoDone(_Base):
    def step(self, messages):
        return {"observations": [], "reward": 1.0} if self.bad else self.good()

class BadObservation(_Base):
    def step(self, messages):
        if self.bad:
            return {"observations": [{"role": "assistant", "content": "i speak for you"}],
                    "reward": 1.0, "done": False}
        return self.good()

class NotJSON(_Base):
    def step(self, messages):
        return {"observations": [], "reward": 1.0, "done": True, **({"x": object()} if self.bad
                                                                    else {})}

class Crashing(_Base):
    def step(self, messages):
        if self.bad:
            os._exit(3)
        return self.good()

class BadReset(_Base):
    def reset(self, task):
        super().reset(task)
        return "hello" if self.bad else [{"role": "user", "content": task["prompt"]}]

    def step(self, messages):
        return self.good()

class Echo(_Base):
    """Records what it saw: the last message, as the observation text's length."""
    def step(self, messages):
        return {"observations": [{"role": "tool", "name": "lookup", "content": "order o2 : lost"}],
                "reward": 0.25, "done": len(messages) >= 6}
'''


def bad_environment_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad_environments.py"
    path.write_text(BAD_ENVIRONMENTS)
    return path
