"""Plan and run through the core, end to end, with the example third-party engine plugin."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture
def echo_spec(write_json, minimal, tmp_path):
    """A spec whose data and reward files exist beside it, pinned by their real sha256."""
    from stateset_backend.spec.content import sha256_file

    (tmp_path / "data").mkdir(exist_ok=True)
    train = tmp_path / "data" / "train.jsonl"
    train.write_text('{"prompt": "p", "answer": "a"}\n' * 2)  # one update's prompts
    reward = tmp_path / "reward.py"
    reward.write_text("def score(prompt, response, answer):\n    return 1.0\n")
    minimal["data"]["train"]["sha256"] = sha256_file(train)
    minimal["reward"]["sha256"] = sha256_file(reward)

    def make(behaviour: str = "ok") -> Path:
        doc = dict(minimal, engine_options={"echo": {"behaviour": behaviour}})
        return write_json(doc, f"spec-{behaviour}.json")

    return make


def _result(runs: Path) -> dict:
    (path,) = runs.glob("*/result.json")
    return json.loads(path.read_text())


def test_plan_document(cli, echo_spec, tmp_path):
    out = tmp_path / "plan.json"
    proc = cli("plan", "--engine", "echo", echo_spec(), "-o", out)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(out.read_text())
    for key in ("run_id", "experiment_digest", "binding_digest", "engine", "engine_version",
                "provider", "argv", "env", "files", "checksum"):
        assert key in plan
    assert plan["engine_version"] == "1.2.0" and plan["provider"] == "local"
    assert all(isinstance(a, str) for a in plan["argv"])
    assert plan["native"]["--updates"] == 3


def test_run_a_spec_end_to_end(cli, echo_spec, tmp_path):
    runs = tmp_path / "runs"
    proc = cli("run", "--engine", "echo", "--runs-dir", runs, echo_spec())
    assert proc.returncode == 0, proc.stderr
    result = _result(runs)
    assert result["status"] == "succeeded" and result["committed_updates"] == 3
    assert all(c["ok"] for c in result["checks"])
    assert result["artifacts"][0]["path"] == "weights.bin"
    assert len(result["artifacts"][0]["sha256"]) == 64
    assert result["metrics"]["raw_names"] == {"reward/mean": "score"}
    attempt = runs / result["run_id"] / "attempts" / "1"
    assert (attempt / "stdout.log").read_text() == "echo engine: done\n"
    assert (attempt / "marker").exists()  # set_env reached the engine, {run_dir} filled in


def test_a_retry_of_the_same_plan_is_an_exact_retry(cli, echo_spec, tmp_path):
    plan, runs = tmp_path / "plan.json", tmp_path / "runs"
    assert cli("plan", "--engine", "echo", echo_spec(), "-o", plan).returncode == 0
    for extra in ([], ["--retry"]):
        assert cli("run", *extra, plan,
                   env={"STATESET_BACKEND_RUNS_DIR": str(runs)}).returncode == 0
    result = _result(runs)
    assert result["attempt"] == 2
    assert result["plan_checksum"] == json.loads(plan.read_text())["checksum"]
    rows = sqlite3.connect(runs / "index.sqlite").execute(
        "SELECT run_id, attempt, status FROM attempts ORDER BY attempt").fetchall()
    assert [(r[1], r[2]) for r in rows] == [(1, "succeeded"), (2, "succeeded")]
    assert len({r[0] for r in rows}) == 1


def test_an_edited_plan_is_refused(cli, echo_spec, tmp_path):
    plan = tmp_path / "plan.json"
    cli("plan", "--engine", "echo", echo_spec(), "-o", plan)
    doc = json.loads(plan.read_text())
    doc["argv"].append("--extra")
    plan.write_text(json.dumps(doc))
    proc = cli("run", "--runs-dir", tmp_path / "runs", plan)
    assert proc.returncode == 2 and "checksum mismatch" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_changed_reward_file_is_refused_before_launch(cli, echo_spec, tmp_path):
    spec = echo_spec()
    (tmp_path / "reward.py").write_text("def score(prompt, response, answer):\n    return 2.0\n")
    proc = cli("run", "--engine", "echo", "--runs-dir", tmp_path / "runs", spec)
    assert proc.returncode == 2 and "reward:" in proc.stderr and "the file changed" in proc.stderr
    from stateset_backend.spec.content import sha256_file

    now = sha256_file(tmp_path / "reward.py")
    # both causes, where the digests part, and the exact edit that accepts the file
    assert "or the spec's digest is wrong" in proc.stderr
    assert f'to accept the file as it is now, set reward.sha256 to "{now}"' in proc.stderr
    pinned = json.loads(spec.read_text())["reward"]["sha256"]
    part = next(i for i, (a, b) in enumerate(zip(now, pinned, strict=True)) if a != b)
    assert f"has sha256 {now[:part]}[{now[part:part + 8]}...], the spec pins " \
           f"{pinned[:part]}[{pinned[part:part + 8]}...] (they differ from hex digit " \
           f"{part + 1})" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_plan_for_another_engine_version_does_not_run(cli, echo_spec, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("plan", "--engine", "echo", "--engine-version", "1.3.0", echo_spec(),
               "-o", plan).returncode == 0
    proc = cli("run", "--runs-dir", tmp_path / "runs", plan)
    assert proc.returncode == 3 and "made for echo 1.3.0 but 1.2.0 is installed" in proc.stderr


@pytest.mark.parametrize("behaviour, code, status, failed_check", [
    ("nan", 5, "invalid", "metrics_finite"),
    ("no-identity", 5, "invalid", "identity"),
    ("no-artifacts", 5, "invalid", "artifacts"),
    ("crash", 4, "failed", "exit_code"),
])
def test_a_bad_outcome_is_never_reported_as_success(cli, echo_spec, tmp_path, behaviour, code,
                                                    status, failed_check):
    runs = tmp_path / "runs"
    proc = cli("run", "--engine", "echo", "--runs-dir", runs, echo_spec(behaviour))
    assert proc.returncode == code, proc.stderr
    result = _result(runs)
    assert result["status"] == status
    assert failed_check in {c["name"] for c in result["checks"] if not c["ok"]}
    assert proc.stderr.strip().splitlines()[-1].startswith("stateset-backend: error: run ")


def _pids_running(*fragments: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if all(f in cmdline for f in fragments):
                pids.append(int(entry.name))
    return pids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_timeout_kills_the_engine(cli, echo_spec, tmp_path):
    runs = tmp_path / "runs"
    t0 = time.monotonic()
    proc = cli("run", "--engine", "echo", "--runs-dir", runs, "--timeout", "2",
               echo_spec("hang"))
    assert proc.returncode == 4 and time.monotonic() - t0 < 30
    result = _result(runs)
    assert result["status"] == "failed"
    assert any(c["detail"] == "timed out" for c in result["checks"])
    plan = runs / result["run_id"] / "plan.json"  # echo writes no checkpoint: a plain rerun
    assert proc.stderr.rstrip().endswith(
        f"no checkpoint to resume from, train it again from scratch with: stateset-backend "
        f"run {plan} --runs-dir {runs} --retry"), proc.stderr


def test_ctrl_c_kills_the_whole_process_group(echo_spec, tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "stateset_backend", "run", "--engine", "echo",
                             "--runs-dir", str(runs), str(echo_spec("hang"))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(runs.glob("*/attempts/1/marker")) and time.monotonic() < deadline:
        time.sleep(0.1)
    engine_pids = _pids_running("stateset_echo_engine.engine", str(runs))
    assert engine_pids
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert _result(runs)["status"] == "interrupted"
    time.sleep(0.5)
    for pid in engine_pids:
        assert not _group_alive(pid)
    # what the user reads next says what happened, never "None"
    shown = subprocess.run([sys.executable, "-m", "stateset_backend", "runs", "show",
                            "--runs-dir", str(runs), _result(runs)["run_id"]],
                           capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert "attempt 1: interrupted, 0/3 updates (interrupted before the first update was " \
           "committed)" in " ".join(shown.stdout.split()), shown.stdout
    assert "None" not in shown.stdout and "None" not in err


def test_a_plan_whose_run_has_attempts_is_never_trained_again_unasked(cli, echo_spec, tmp_path):
    """Running the same plan twice used to train it again from scratch as attempt 2."""
    plan, runs = tmp_path / "plan.json", tmp_path / "runs"
    cli("plan", "--engine", "echo", echo_spec(), "-o", plan)
    run_id = json.loads(plan.read_text())["run_id"]
    assert cli("run", "--runs-dir", runs, plan).returncode == 0
    again = cli("run", "--runs-dir", runs, plan)
    assert again.returncode == 0
    assert f"run {run_id} is already complete (attempt 1:" in again.stdout
    assert f"stateset-backend runs show {run_id}" in again.stdout
    assert f"as attempt 2: stateset-backend run {plan} --retry" in again.stdout
    assert sorted(p.name for p in (runs / run_id / "attempts").iterdir()) == ["1"]
    retried = cli("run", "--runs-dir", runs, "--retry", plan)
    assert retried.returncode == 0
    assert sorted(p.name for p in (runs / run_id / "attempts").iterdir()) == ["1", "2"]


def test_an_unfinished_run_names_the_ways_on(cli, echo_spec, tmp_path):
    plan, runs = tmp_path / "plan.json", tmp_path / "runs"
    cli("plan", "--engine", "echo", echo_spec("crash"), "-o", plan)
    run_id = json.loads(plan.read_text())["run_id"]
    assert cli("run", "--runs-dir", runs, plan).returncode == 4
    again = cli("run", "--runs-dir", runs, plan)
    assert again.returncode == 2
    line, = again.stderr.strip().splitlines()
    assert f"run {run_id} already has 1 attempt; attempt 1 ended failed after 0/" in line
    # it crashed before its first checkpoint: only --retry can go on, so only it is offered
    assert "and no attempt left a checkpoint to resume from. To train it again from scratch " \
           f"as attempt 2: stateset-backend run {plan} --retry" in line
    assert "--resume" not in line
    assert sorted(p.name for p in (runs / run_id / "attempts").iterdir()) == ["1"]
    assert cli("run", "--runs-dir", runs, "--retry", "--resume", plan).returncode == 2


def test_the_commands_it_suggests_can_be_pasted(cli, echo_spec, tmp_path):
    """A plan path with a space is quoted in the suggested command, as a shell needs it."""
    folder = tmp_path / "my plans"
    folder.mkdir()
    plan, runs = folder / "plan.json", tmp_path / "runs"
    cli("plan", "--engine", "echo", echo_spec(), "-o", plan)
    assert cli("run", "--runs-dir", runs, plan).returncode == 0
    again = cli("run", "--runs-dir", runs, plan)
    assert f"stateset-backend run '{plan}' --retry" in again.stdout
