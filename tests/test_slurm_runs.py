"""The native engine's main job through ``--provider slurm`` on a real single-node Slurm
(tests/slurm_cluster.py), end to end through the CLI: the same identity and metrics as the
local provider, Ctrl-C cancels the job, and Slurm's warning signal leads to a checkpoint from
which the run resumes as a new attempt of the same run, ending with the uninterrupted weights."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import ON_ONE_WORKER, RAY_AUTH_VARS, slurm  # noqa: F401  (the fixture)

from stateset_backend.cli import main

pytestmark = [pytest.mark.slow, ON_ONE_WORKER]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    """The README's job, shortened: 40 updates, a checkpoint and a validation every 10."""
    folder = tmp_path_factory.mktemp("spec")
    shutil.copytree(EXAMPLES / "support-routing", folder / "support-routing")
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    doc["budget"]["total_updates"] = 40
    doc["checkpoint"] = {"every": 10, "keep": 4}
    doc["evaluation"]["every"] = 10
    path = folder / "spec.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def on_slurm(slurm, monkeypatch, tmp_path):  # noqa: F811
    """Jobs get this environment (sbatch exports it): a home of their own, no Ray token."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    for name in RAY_AUTH_VARS:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return slurm


def _plan(spec: Path, out: Path, *slurm_args: str) -> dict:
    provider = ["--provider", "slurm", "--slurm-shared-root", "/", *slurm_args]
    assert main(["plan", "--engine", "native", str(spec), "-o", str(out), *provider]) == 0
    return json.loads(out.read_text())


def _series(run_dir: Path) -> list[dict]:
    attempt = max((run_dir / "attempts").iterdir(), key=lambda p: int(p.name))
    rows = [json.loads(line) for line in
            (attempt / "canonical_metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "tokens_per_second"))}
            for r in rows]


def _weights(run_dir: Path, attempt: int) -> str:
    final = run_dir / "attempts" / str(attempt) / "final" / "model.safetensors"
    return hashlib.sha256(final.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def local_run(spec, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("local")
    plan = tmp / "plan.json"
    assert main(["plan", "--engine", "native", str(spec), "-o", str(plan)]) == 0
    assert main(["run", "--runs-dir", str(tmp / "runs"), "--quiet", str(plan)]) == 0
    doc = json.loads(plan.read_text())
    return doc, tmp / "runs" / doc["run_id"]


def test_the_main_job_on_slurm_is_the_local_run(on_slurm, spec, local_run, tmp_path, capsys):
    plan = _plan(spec, tmp_path / "plan.json", "--slurm-time", "00:10:00")
    assert plan["provider"] == "slurm" and "slurm/job.sbatch" in plan["files"]
    capsys.readouterr()
    assert main(["--json", "run", "--runs-dir", str(tmp_path / "runs"), "--quiet",
                 str(tmp_path / "plan.json")]) == 0
    result = json.loads(capsys.readouterr().out)
    local, local_dir = local_run
    assert result["status"] == "succeeded" and result["provider"] == "slurm"
    assert result["experiment_digest"] == local["experiment_digest"]
    run_dir = tmp_path / "runs" / plan["run_id"]
    assert (run_dir / "attempts" / "1" / "slurm" / "job_id").read_text().strip().isdigit()
    assert _series(run_dir) == _series(local_dir)
    assert _weights(run_dir, 1) == _weights(local_dir, 1)


def _start(plan: Path, runs: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stateset_backend", "run", "--runs-dir",
                             str(runs), str(plan)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def _wait_for(path_of, limit_s: float = 120.0) -> Path:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        found = path_of()
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError("timed out waiting for the run")


def test_ctrl_c_cancels_the_job(on_slurm, spec, tmp_path):
    doc = _plan(spec, tmp_path / "plan.json")
    attempt = tmp_path / "runs" / doc["run_id"] / "attempts" / "1"
    proc = _start(tmp_path / "plan.json", tmp_path / "runs")
    _wait_for(lambda: attempt / "metrics.jsonl" if (attempt / "metrics.jsonl").exists()
              else None)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    job = (attempt / "slurm" / "job_id").read_text().strip()
    assert "JobState=CANCELLED" in on_slurm.run("scontrol", "show", "job", "-o", job).stdout
    result = json.loads((attempt / "result.json").read_text())
    assert result["status"] == "interrupted"


def test_the_warning_signal_checkpoints_and_the_run_resumes_to_the_same_weights(
        on_slurm, spec, local_run, tmp_path):
    doc = _plan(spec, tmp_path / "plan.json", "--slurm-requeue", "1")
    run_dir = tmp_path / "runs" / doc["run_id"]
    first = run_dir / "attempts" / "1"
    proc = _start(tmp_path / "plan.json", tmp_path / "runs")
    # after the first periodic checkpoint, as Slurm's --signal=B:USR1@N would before the limit
    _wait_for(lambda: first / "checkpoints" / "update-000010"
              if (first / "checkpoints" / "update-000010").is_dir() else None)
    job = (first / "slurm" / "job_id").read_text().strip()
    assert on_slurm.run("scancel", "--batch", "--signal=USR1", job).returncode == 0
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    stopped = json.loads((first / "result.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["exit_code"] == 75
    assert stopped["committed_updates"] < 40
    # the checkpoint the request asked for, at the update the engine stopped at
    assert (first / "checkpoints" / f"update-{stopped['committed_updates']:06d}").is_dir()
    resumed = json.loads((run_dir / "attempts" / "2" / "result.json").read_text())
    assert resumed["status"] == "succeeded" and resumed["run_id"] == doc["run_id"]
    assert resumed["resumed_from"]["update"] == stopped["committed_updates"]
    assert "resuming it" in err
    _, local_dir = local_run
    assert _weights(run_dir, 2) == _weights(local_dir, 1)


def test_a_refused_submission_is_a_failed_attempt_in_the_listing(on_slurm, spec, tmp_path,
                                                                 capsys):
    """sbatch refuses a partition the cluster lacks: the attempt still ends with a result
    saying it never started, in Slurm's words (one line), and the run is listed, also after a
    reindex."""
    doc = _plan(spec, tmp_path / "plan.json", "--slurm-partition", "nosuchpartition")
    runs = tmp_path / "runs"
    capsys.readouterr()
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(tmp_path / "plan.json")]) == 4
    err = capsys.readouterr().err
    line, = [x for x in err.splitlines() if x.startswith("stateset-backend: error:")]
    assert "failed: never started: Slurm refused the job: sbatch: error:" in line, err
    assert "nosuchpartition" in line.lower() or "partition" in line.lower()
    assert "['" not in line and "--retry" in line
    assert "engine exited" not in line and "identity" not in line  # nothing ran to check
    result = json.loads((runs / doc["run_id"] / "attempts" / "1" / "result.json").read_text())
    assert result["status"] == "failed" and result["provider"] == "slurm"
    assert result["exit_code"] is None  # the engine never had one
    exit_check, = [c for c in result["checks"] if c["name"] == "exit_code"]
    assert exit_check["detail"].startswith("never started: Slurm refused the job: sbatch: ")
    for command in ([], ["reindex"]):
        if command:
            assert main(["runs", "reindex", "--runs-dir", str(runs)]) == 0
        capsys.readouterr()
        assert main(["--json", "runs", "list", "--runs-dir", str(runs)]) == 0
        listed = capsys.readouterr().out
        assert doc["run_id"] in listed and "failed" in listed


def _in_flight(capsys, runs: Path, *status: str) -> list[dict]:
    capsys.readouterr()
    assert main(["--json", "runs", "list", "--runs-dir", str(runs), *status]) == 0
    return json.loads(capsys.readouterr().out)["in_flight"]


def test_runs_list_shows_attempts_in_flight_and_a_resume_gets_more_time(
        on_slurm, spec, tmp_path, capsys):
    doc = _plan(spec, tmp_path / "plan.json", "--slurm-time", "00:05:00")
    plan, runs = tmp_path / "plan.json", tmp_path / "runs"
    run_dir = runs / doc["run_id"]
    first = run_dir / "attempts" / "1"
    blocker = on_slurm.run("sbatch", "--parsable", f"--cpus-per-task={os.cpu_count() or 1}",
                           "-o", "/dev/null", "--wrap", "sleep 300").stdout.strip()
    proc = _start(plan, runs)
    try:
        job = _wait_for(lambda: first / "slurm" / "job_id" if (
            first / "slurm" / "job_id").is_file() else None).read_text().strip()
        waiting = _wait_for(lambda: [r for r in _in_flight(capsys, runs, "--status", "pending")
                                     if r["reason"]] or None)  # once Slurm has a reason
        assert waiting == [{"run_id": doc["run_id"], "attempt": 1, "provider": "slurm",
                            "job": job, "state": "pending", "job_state": "PENDING",
                            "reason": waiting[0]["reason"], "run_process": "running"}]
        assert waiting[0]["reason"] in ("Resources", "Priority")
    finally:
        on_slurm.run("scancel", blocker)
    _wait_for(lambda: first / "checkpoints" / "update-000010"
              if (first / "checkpoints" / "update-000010").is_dir() else None)
    running = _in_flight(capsys, runs)
    assert [(r["run_id"], r["job"], r["state"]) for r in running] == [
        (doc["run_id"], job, "running")]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert _in_flight(capsys, runs) == []
    # only a later attempt of the run may get another limit, and only the limit
    for refused in (["--slurm-time", "00:20:00"],
                    ["--resume", "--slurm-time", "00:20:00", "--slurm-partition", "debug"]):
        assert main(["run", "--runs-dir", str(runs), str(plan), *refused]) == 2
        line, = capsys.readouterr().err.strip().splitlines()
        assert "--slurm-time with a plan gives a Slurm plan's run more time" in line
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan), "--resume",
                 "--slurm-time", "00:20:00"]) == 0
    second = run_dir / "attempts" / "2"
    script = (second / "slurm" / "job.sbatch").read_text()
    assert "#SBATCH --time=00:20:00" in script.splitlines()
    assert "the plan's: 00:05:00" in script and "#SBATCH --time=00:05:00" not in script
    job2 = (second / "slurm" / "job_id").read_text().strip()
    assert "TimeLimit=00:20:00 " in on_slurm.run("scontrol", "show", "job", "-o", job2).stdout
    resumed = json.loads((second / "result.json").read_text())
    assert resumed["status"] == "succeeded" and resumed["resumed_from"]["attempt"] == 1
    assert json.loads((run_dir / "plan.json").read_text()) == json.loads(plan.read_text())


def _listing(capsys, runs: Path, *status: str) -> dict:
    capsys.readouterr()
    assert main(["--json", "runs", "list", "--runs-dir", str(runs), *status]) == 0
    return json.loads(capsys.readouterr().out)


def _screen(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return " ".join(capsys.readouterr().out.split())  # the table's cells, unwrapped


def test_a_killed_run_whose_job_goes_on_is_listed_as_slurm_says_then_abandoned(
        on_slurm, spec, tmp_path, capsys):
    """`run` killed outright (SIGKILL: no handler runs, so the job is not cancelled) while its
    job waits in the queue: `runs list` shows the job pending, then running, as Slurm says,
    with its job id and that its `run` is gone; once the job has ended it is listed as
    abandoned with Slurm's final state, no longer in flight."""
    doc = _plan(spec, tmp_path / "plan.json", "--slurm-time", "00:05:00")
    runs = tmp_path / "runs"
    first = runs / doc["run_id"] / "attempts" / "1"
    blocker = on_slurm.run("sbatch", "--parsable", f"--cpus-per-task={os.cpu_count() or 1}",
                           "-o", "/dev/null", "--wrap", "sleep 300").stdout.strip()
    proc = _start(tmp_path / "plan.json", runs)
    try:
        job = _wait_for(lambda: first / "slurm" / "job_id" if (
            first / "slurm" / "job_id").is_file() else None).read_text().strip()
        _wait_for(lambda: [r for r in _in_flight(capsys, runs, "--status", "pending")
                           if r["reason"]] or None)
        proc.kill()
        proc.communicate(timeout=60)
        pending, = _in_flight(capsys, runs, "--status", "pending")
        assert (pending["job"], pending["job_state"], pending["run_process"]) == (
            job, "PENDING", "gone")
        assert pending["reason"].endswith(
            f"its `run` process is gone: the job goes on, but nothing will record its result "
            f"(scancel {job} stops it)"), pending
    finally:
        on_slurm.run("scancel", blocker)
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    running = _wait_for(lambda: _in_flight(capsys, runs, "--status", "running") or None)
    assert [(r["job"], r["state"], r["job_state"], r["run_process"]) for r in running] == [
        (job, "running", "RUNNING", "gone")]
    screen = _screen(capsys, "runs", "list", "--runs-dir", str(runs))
    assert "in flight (no result yet)" in screen and f"slurm job {job}" in screen
    assert "running (its `run` process is gone: the job goes on" in screen, screen
    assert on_slurm.run("scancel", job).returncode == 0
    listing = _wait_for(lambda: (lambda d: d if d["abandoned"] else None)(
        _listing(capsys, runs)))
    assert listing["in_flight"] == []
    row, = listing["abandoned"]
    assert (row["run_id"], row["job"], row["state"], row["job_state"], row["run_process"]) == (
        doc["run_id"], job, "abandoned", "CANCELLED", "gone")
    assert row["reason"].startswith(f"Slurm job {job} ended CANCELLED") and \
        row["reason"].endswith("; its `run` process is gone, so no result was recorded")
    assert _listing(capsys, runs, "--status", "abandoned")["abandoned"] == [row]
    assert _listing(capsys, runs, "--status", "running")["in_flight"] == []
    screen = _screen(capsys, "runs", "list", "--runs-dir", str(runs))
    assert "abandoned (the job ended, its `run` was gone: no result)" in screen
    assert "in flight" not in screen and f"Slurm job {job} ended CANCELLED" in screen, screen
    shown = _screen(capsys, "runs", "show", doc["run_id"], "--runs-dir", str(runs))
    assert f"attempt 1: unknown (no result.json: Slurm job {job} ended CANCELLED" in shown, shown
    # the next `run` of the plan records the attempt from how Slurm says the job ended, then
    # its rerun guard speaks of a failed attempt, not of one in flight
    capsys.readouterr()
    assert main(["run", str(tmp_path / "plan.json"), "--runs-dir", str(runs)]) == 2
    guard = capsys.readouterr().err
    assert "--retry" in guard and "Traceback" not in guard, guard
    result = json.loads((first / "result.json").read_text())
    assert result["status"] == "failed" and result["exit_code"] != 1, result
    assert f"Slurm job {job} outlived its killed `run`" in json.dumps(result), result
    listing = _listing(capsys, runs)
    assert listing["abandoned"] == [] and listing["in_flight"] == []
