"""Bad environments in training: a conversation whose environment raised, hung past the
deadline or answered malformed output ends with its error recorded and no reward; it carries
no loss; and when more of an update's conversations fail than environment.max_failed_share
allows, the update is refused with nothing applied."""

from __future__ import annotations

import json

import pytest
import torch
from native.agent_support import agent_spec, bad_environment_file, make_trainer, with_environment

from stateset_backend.native.multiturn.conversation import FailedShareExceeded


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("name, timeout, reason", [
    ("Raising", 10, "raised RuntimeError: the order database is down"),
    ("Hanging", 1, "exceeded environment.step_timeout_s"),
    ("StringReward", 10, "not a finite number"),
    ("BadReset", 10, "reset returned no list"),
])
def test_failed_conversations_are_recorded_and_never_rewarded(tmp_path, name, timeout, reason):
    doc = with_environment(agent_spec(**{"budget.total_updates": 1, "budget.prompts_per_update": 8,
                                         "environment.max_failed_share": 1.0,
                                         "environment.step_timeout_s": timeout}),
                           bad_environment_file(tmp_path), name)
    trainer = make_trainer(doc, tmp_path / "out")
    trainer.train()
    out = tmp_path / "out"
    (receipt,) = _rows(out / "receipts.jsonl")
    trajectories = _rows(out / "trajectories" / "update-000001.jsonl")
    failed = [t for t in trajectories if t["error"]]
    assert failed and receipt["failed"] == len(failed)
    for t in failed:
        assert reason in t["error"] and t["return"] is None and t["ended_by"] == "error"
        assert t["excluded"].startswith("environment failed")
    by_id = {c["conversation"]: c for c in receipt["conversations"]}
    assert all(by_id[t["conversation"]]["learned_turns"] == [] for t in failed)
    ok = [t for t in trajectories if not t["error"]]
    assert all(t["return"] == 1.0 for t in ok)  # the good ones: one step, reward 1
    (metrics,) = _rows(out / "metrics.jsonl")
    assert metrics["conversations/failed_share"] == len(failed) / len(trajectories)
    assert metrics["reward/mean"] == 1.0  # the mean of real rewards only


def test_the_failed_share_refuses_the_update_and_applies_nothing(tmp_path):
    doc = with_environment(agent_spec(**{"budget.total_updates": 1,
                                         "budget.prompts_per_update": 8}),
                           bad_environment_file(tmp_path), "Raising")
    assert doc["environment"]["max_failed_share"] == 0.0
    trainer = make_trainer(doc, tmp_path / "out")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(FailedShareExceeded, match=r"max_failed_share 0\.0.*refused"):
        trainer.train()
    assert trainer.update_count == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(),
                                                 strict=True))
    assert not (tmp_path / "out" / "receipts.jsonl").exists()
    # the refused update's conversations are the evidence of why: they are kept
    trajectories = _rows(tmp_path / "out" / "trajectories" / "update-000001.jsonl")
    failed = [t for t in trajectories if t["error"]]
    assert failed and all("the order database is down" in t["error"] for t in failed)


def test_the_cli_run_fails_with_the_reason(cli, spec_file, tmp_path):
    doc = with_environment(agent_spec(**{"budget.prompts_per_update": 8}),
                           bad_environment_file(tmp_path), "Crashing")
    proc = cli("run", "--engine", "native", "--runs-dir", tmp_path / "runs", spec_file(doc))
    assert proc.returncode == 4
    (result,) = (tmp_path / "runs").glob("*/result.json")
    doc = json.loads(result.read_text())
    assert doc["status"] == "failed" and doc["committed_updates"] == 0
    assert "FailedShareExceeded" in proc.stderr and "exited during step" in proc.stderr


def _validating(tmp_path, environment: str, share: float):
    doc = with_environment(agent_spec(**{"environment.max_failed_share": share,
                                         "evaluation": {"every": 1}}),
                           bad_environment_file(tmp_path), environment)
    return make_trainer(doc, tmp_path / "out")


def test_validation_is_held_to_the_failed_share_and_recorded(tmp_path):
    """A quarter of the validation tasks break the environment: over max_failed_share the
    validation fails naming the first failure; every conversation is on disk either way."""
    trainer = _validating(tmp_path, "Raising", 0.0)
    with pytest.raises(FailedShareExceeded,
                       match=r"validation: 25 of 100 conversations failed.*survivors.*"
                             r"First failure \(task row \d+\): .*the order database is down"):
        trainer.validate()
    rows = _rows(tmp_path / "out" / "trajectories" / "validation-update-000000.jsonl")
    assert len(rows) == 100 and sum(1 for r in rows if r["error"]) == 25
    assert all(r["return"] is None for r in rows if r["error"])


def test_validation_within_the_share_reports_the_failures_beside_the_reward(tmp_path):
    metrics = _validating(tmp_path, "Raising", 0.5).validate()
    assert metrics == {"val/reward/mean": 1.0, "val/conversations/failed_share": 0.25}


def test_validation_where_every_conversation_failed_reports_no_reward(tmp_path):
    with pytest.raises(FailedShareExceeded, match=r"validation: every one of 100 conversations "
                                                  r"failed.*no reward.*First failure "
                                                  r"\(task row \d+\): .*database is down"):
        _validating(tmp_path, "Down", 1.0).validate()
