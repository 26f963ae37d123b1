"""Resume never trusts damaged state and never re-runs a finished run: a corrupt or incomplete
newest checkpoint is exit 6 naming the file and what is wrong; a complete run is "already
complete" with exit 0 and nothing launched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One real native run (6 updates, checkpoints every 2), shared by the tests below."""
    import importlib.util

    from stateset_backend.cli import main

    where = importlib.util.spec_from_file_location("native_conftest",
                                                   Path(__file__).with_name("conftest.py"))
    assert where is not None and where.loader is not None
    conftest = importlib.util.module_from_spec(where)
    where.loader.exec_module(conftest)
    tiny_spec = conftest.tiny_spec

    tmp = tmp_path_factory.mktemp("resume")
    spec, plan, runs = tmp / "spec.json", tmp / "plan.json", tmp / "runs"
    spec.write_text(json.dumps(tiny_spec(**{"evaluation.every": None,
                                            "evaluation.select_by": None})))
    assert main(["plan", "--engine", "native", str(spec), "-o", str(plan)]) == 0
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan)]) == 0
    return plan, runs, json.loads(plan.read_text())["run_id"]


def _copy_run(finished, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the finished run whose last attempt reads as interrupted."""
    import shutil

    plan, runs, run_id = finished
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    result_path = copy / run_id / "result.json"
    doc = json.loads(result_path.read_text())
    result_path.write_text(json.dumps({**doc, "status": "interrupted"}))
    newest = sorted((copy / run_id / "attempts" / "1" / "checkpoints").iterdir())[-1]
    return plan, copy, newest


def test_resuming_a_complete_run_runs_nothing(finished, capsys):
    from stateset_backend.cli import main

    plan, runs, run_id = finished
    before = sorted((runs / run_id / "attempts").iterdir())
    assert main(["run", "--runs-dir", str(runs), "--resume", str(plan)]) == 0
    assert "already complete (6/6 updates" in capsys.readouterr().out
    assert sorted((runs / run_id / "attempts").iterdir()) == before


@pytest.mark.parametrize("damage, expected", [
    (lambda d: (d / "weights.safetensors").write_bytes(
        (d / "weights.safetensors").read_bytes()[:100]), "weights.safetensors: its content"),
    (lambda d: (d / "optimizer.pt").write_bytes(
        bytes([(d / "optimizer.pt").read_bytes()[0] ^ 1]) +
        (d / "optimizer.pt").read_bytes()[1:]), "optimizer.pt: its content"),
    (lambda d: (d / "manifest.json").write_text("{not json"), "manifest.json: unreadable"),
    (lambda d: (d / "rng.pt").unlink(), "rng.pt: missing"),
])
def test_a_damaged_newest_checkpoint_is_exit_6_naming_the_file(finished, tmp_path, capsys,
                                                               damage, expected):
    from stateset_backend.cli import main

    plan, runs, newest = _copy_run(finished, tmp_path)
    damage(newest)
    code = main(["run", "--runs-dir", str(runs), "--resume", str(plan)])
    err = capsys.readouterr().err
    assert code == 6 and expected in err and newest.name in err, err
    assert len(err.strip().splitlines()) == 1
