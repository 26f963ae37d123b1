"""`run PLAN --resume` continues an interrupted run from its newest complete checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from interrupting import interrupt_when, write_holding_reward


def test_interrupt_then_resume(cli, tiny, spec_file, tmp_path):
    plan, runs = tmp_path / "plan.json", tmp_path / "runs"
    doc = tiny(**{"budget.total_updates": 40, "evaluation.every": None})
    reward = write_holding_reward(tmp_path / "reward.py", Path(
        doc["reward"]["entrypoint"].rpartition(":")[0]).read_text())
    doc["reward"].update(entrypoint=f"{reward}:score",
                         sha256=hashlib.sha256(reward.read_bytes()).hexdigest())
    assert cli("plan", "--engine", "native", spec_file(doc), "-o", plan).returncode == 0
    run_id = json.loads(plan.read_text())["run_id"]
    ckpts = runs / run_id / "attempts" / "1" / "checkpoints"
    err = interrupt_when(["run", "--runs-dir", str(runs), "--quiet", str(plan)],
                         ckpts / "update-000004" / "manifest.json")
    first = json.loads((runs / run_id / "result.json").read_text())
    assert first["status"] == "interrupted" and first["committed_updates"] < 40
    # The message names the exact command that continues the run, and that command works.
    stored = runs / run_id / "plan.json"
    hint = f"stateset-backend run {stored} --runs-dir {runs} --resume"
    assert "resume from the checkpoint of update " in err and err.rstrip().endswith(hint), err

    resumed = cli(*hint.split()[1:], "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((runs / run_id / "result.json").read_text())
    assert result["attempt"] == 2 and result["status"] == "succeeded"
    assert result["committed_updates"] == 40
    check = next(c for c in result["checks"] if c["name"] == "resume")
    assert check["ok"] and check["detail"].startswith("continued from update ")
    steps = [json.loads(x)["step"] for x in
             (runs / run_id / "attempts" / "2" / "metrics.jsonl").read_text().splitlines()]
    start = int(check["detail"].rsplit(" ", 1)[1])
    assert start >= 4 and steps == list(range(start + 1, 41))


def test_resume_without_a_checkpoint_is_exit_6(cli, tiny, spec_file, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("plan", "--engine", "native", spec_file(tiny()), "-o", plan).returncode == 0
    proc = cli("run", "--runs-dir", tmp_path / "runs", "--resume", plan)
    assert proc.returncode == 6
    assert "has no complete checkpoint to resume from" in proc.stderr


def test_resume_needs_a_plan_and_names_the_runs_one(capsys, tiny, spec_file, tmp_path):
    from stateset_backend.cli import main

    spec, runs = spec_file(tiny(**{"budget.total_updates": 2})), tmp_path / "runs"
    assert main(["run", "--engine", "native", "--resume", "--runs-dir", str(runs), str(spec)]) == 2
    err = capsys.readouterr().err
    assert "pass its PLAN" in err and f"{runs} holds no run of this spec on native" in err
    assert main(["run", "--engine", "native", "--quiet", "--runs-dir", str(runs), str(spec)]) == 0
    capsys.readouterr()
    assert main(["run", "--engine", "native", "--resume", "--runs-dir", str(runs), str(spec)]) == 2
    err = capsys.readouterr().err
    (run_id,) = [p.name for p in runs.iterdir() if p.is_dir()]
    assert err.rstrip().endswith(f"the newest run of this spec on native is {run_id} (succeeded): "
                                 f"stateset-backend run {runs / run_id / 'plan.json'} --resume "
                                 f"--runs-dir {runs}"), err


def test_a_spec_without_engine_is_named_a_spec(capsys, tiny, spec_file):
    from stateset_backend.cli import main

    spec = spec_file(tiny())
    assert main(["run", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}: a spec, not a plan: run it with --engine ENGINE" in err, err
    assert "Field required" not in err
