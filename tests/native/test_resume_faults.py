"""Resume never trusts damaged state and never re-runs a finished run: a corrupt or incomplete
newest checkpoint is exit 6 naming the file and what is wrong; a complete run is "already
complete" with exit 0 and nothing launched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = pytest.mark.xdist_group(__name__)


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


def test_a_run_killed_after_its_last_checkpoint_finishes_on_resume(finished, tmp_path,
                                                                   capsys):
    """Killed between the last checkpoint and the final model: the resume has no update left
    to train; it writes the final model from that checkpoint and the run reads as one."""
    import shutil

    from safetensors.torch import load_file

    from stateset_backend.cli import main

    plan, runs, newest = _copy_run(finished, tmp_path)
    run_id = newest.parent.parent.parent.parent.name
    first = runs / run_id / "attempts" / "1"
    shutil.rmtree(first / "final")
    assert newest.name == "update-000006"
    assert main(["run", "--runs-dir", str(runs), "--resume", "--quiet", str(plan)]) == 0
    result = json.loads((runs / run_id / "result.json").read_text())
    assert result["status"] == "succeeded" and result["attempt"] == 2
    assert result["resumed_from"] == {"attempt": 1, "update": 6}
    assert result["committed_updates"] == 6
    check = next(c for c in result["checks"] if c["name"] == "metrics_finite")
    assert check["ok"] and "nothing left to train" in check["detail"]
    # the run's series and summary are the first attempt's: nothing was trained twice
    second = runs / run_id / "attempts" / "2"
    assert (second / result["metrics"]["series"]).read_text() == \
        (first / "canonical_metrics.jsonl").read_text()
    assert result["metrics"]["summary"] == json.loads(
        (first / "result.json").read_text())["metrics"]["summary"]
    (weights,) = (second / "final").glob("*.safetensors")
    saved = load_file(str(newest / "weights.safetensors"))
    final = load_file(str(weights))
    assert all((final[n] == saved[n]).all() for n in saved)


def test_a_resumed_run_selects_and_evaluates_across_its_attempts(tmp_path, capsys):
    """Validated checkpoints of the attempt that was interrupted stay candidates; the
    recommended one is named with its attempt, and `evaluate` scores that very folder."""
    import importlib.util
    import shutil

    from stateset_backend.cli import main
    from stateset_backend.runs.results import SavedCheckpoint, select_checkpoint

    where = importlib.util.spec_from_file_location("native_conftest",
                                                   Path(__file__).with_name("conftest.py"))
    assert where is not None and where.loader is not None
    conftest = importlib.util.module_from_spec(where)
    where.loader.exec_module(conftest)
    spec, plan, runs = tmp_path / "spec.json", tmp_path / "plan.json", tmp_path / "runs"
    spec.write_text(json.dumps(conftest.tiny_spec(**{"evaluation.every": 2})))
    assert main(["plan", "--engine", "native", str(spec), "-o", str(plan)]) == 0
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan)]) == 0
    run_id = json.loads(plan.read_text())["run_id"]
    first = runs / run_id / "attempts" / "1"
    # as if interrupted after the checkpoint of update 4: 6 and the final model never written
    shutil.rmtree(first / "checkpoints" / "update-000006")
    shutil.rmtree(first / "final")
    doc = json.loads((first / "result.json").read_text())
    doc["artifacts"] = [a for a in doc["artifacts"]
                        if a["step"] != 6 and not a["path"].startswith("final/")]
    doc["status"] = "interrupted"
    for path in (first / "result.json", runs / run_id / "result.json"):
        path.write_text(json.dumps(doc))
    assert main(["run", "--runs-dir", str(runs), "--resume", "--quiet", str(plan)]) == 0
    second = runs / run_id / "attempts" / "2"
    result = json.loads((second / "result.json").read_text())
    assert result["resumed_from"] == {"attempt": 1, "update": 4}
    rows = [json.loads(x) for x in (second / result["metrics"]["series"]).read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    earlier = [json.loads(x) for x in (first / "canonical_metrics.jsonl").read_text()
               .splitlines()]
    assert rows[:5] == earlier[:5]
    saved = {2: SavedCheckpoint(1, "checkpoints/update-000002"),
             4: SavedCheckpoint(1, "checkpoints/update-000004"),
             6: SavedCheckpoint(2, "checkpoints/update-000006")}
    expected = select_checkpoint("val/reward/mean", rows, saved)
    assert expected is not None and result["selection"] == expected
    capsys.readouterr()
    assert main(["evaluate", run_id, "--runs-dir", str(runs), "--split", "validation",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["checkpoint"]["update"] == expected["update"]
    assert record["checkpoint"]["attempt"] == expected["attempt"]
    logged = next(r for r in rows if r["step"] == expected["update"])
    assert record["metrics"] == {k: v for k, v in logged.items() if k.startswith("val/")}
