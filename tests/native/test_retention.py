"""Checkpoint retention (checkpoint.keep) never deletes the checkpoint that selection
(evaluation.select_by) would recommend: the newest ``keep`` survive, and so does the best."""

from __future__ import annotations

import json

from native.conftest import tiny_spec

from stateset_backend.native import checkpoint
from stateset_backend.native.trainer import RunSettings, Trainer
from stateset_backend.runs.results import SavedCheckpoint, select_checkpoint
from stateset_backend.spec.digest import experiment_digest
from stateset_backend.spec.files import parse_spec


def _trainer(tmp_path, select_by: str) -> Trainer:
    spec = parse_spec(tiny_spec(**{"budget.total_updates": 6,
                                   "checkpoint": {"every": 1, "keep": 1},
                                   "evaluation": {"every": 1, "select_by": select_by}}))
    return Trainer(RunSettings("20260101T000000Z-00000000", experiment_digest(spec), spec,
                               tmp_path), tmp_path)


def test_the_best_checkpoint_survives_retention_beside_the_newest(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, "val/reward/mean")
    scores = iter([0.0, 0.2, 0.9, 0.5, 0.9, 0.1, 0.3])  # update 0 (untrained), then 1..6
    monkeypatch.setattr(trainer, "validate", lambda: {"val/reward/mean": next(scores)})
    trainer.train()
    kept = [p.name for p in checkpoint.complete_checkpoints(tmp_path / "checkpoints")]
    assert kept == ["update-000002", "update-000006"]  # 4 ties 2: the earlier one is best
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    saved = {int(name.split("-")[1]): SavedCheckpoint(1, f"checkpoints/{name}")
             for name in kept}
    chosen = select_checkpoint("val/reward/mean", rows, saved)
    assert chosen is not None and chosen["update"] == 2  # what the core recommends survived


def test_for_a_failure_share_the_lowest_survives(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, "val/conversations/failed_share")
    shares = iter([0.5, 0.4, 0.1, 0.3, 0.6, 0.2, 0.7])
    monkeypatch.setattr(trainer, "validate",
                        lambda: {"val/conversations/failed_share": next(shares)})
    trainer.train()
    kept = [p.name for p in checkpoint.complete_checkpoints(tmp_path / "checkpoints")]
    assert kept == ["update-000002", "update-000006"]
