"""A `run` process killed outright (SIGKILL: a CI runner's timeout, a scheduler's pre-emption)
takes its engine's whole process group with it, and the attempt reads as interrupted with
what it committed: `runs show`, `runs list` and `run PLAN --resume` see it so."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads process groups from /proc (Linux)")


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group: once `run` is dead its engine's
    new parent may be a PID 1 that never reaps, and a zombie runs nothing."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _processes_with(*needles: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if all(n in cmdline for n in needles):
            found.append(int(entry.name))
    return found


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _kill_group(pgid: int) -> None:
    """Leave no engine behind when an assertion fails while it runs."""
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _start_run(cli, spec: Path, tmp_path: Path) -> tuple[Path, Path, str, Path,
                                                         subprocess.Popen[bytes]]:
    """(runs folder, plan, run id, attempt 1's folder, the `run` process) of a plan of
    ``spec`` being run in a process of its own, as a supervisor would start it."""
    runs, plan = tmp_path / "runs", tmp_path / "plan.json"
    assert cli("plan", "--engine", "echo", spec, "-o", plan).returncode == 0
    run_id = json.loads(plan.read_text())["run_id"]
    proc = subprocess.Popen([sys.executable, "-m", "stateset_backend", "run", "--quiet",
                             "--runs-dir", str(runs), str(plan)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return runs, plan, run_id, runs / run_id / "attempts" / "1", proc


@pytest.fixture
def hanging_echo(write_json, minimal_with_files):
    """An echo-engine spec whose engine parks after it starts, until it is killed."""
    return write_json(dict(minimal_with_files, engine_options={"echo": {"behaviour": "hang"}}))


def test_a_killed_run_takes_its_engine_group_along_and_reads_interrupted(
        cli, hanging_echo, tmp_path):
    runs, plan, run_id, attempt, proc = _start_run(cli, hanging_echo, tmp_path)
    try:
        _wait_for(lambda: (attempt / "marker").exists(), 60, "the engine never started")
        (engine,) = _processes_with("stateset_echo_engine.engine", str(runs))
        pgid = os.getpgid(engine)
        assert pgid != os.getpgid(proc.pid)  # the engine runs in a group of its own
        # What the engine committed before `run` died: the echo engine's own log lines,
        # which the adapter's collect reads as it does after any stop.
        (attempt / "identity.json").write_text(json.dumps(
            {"run_id": run_id, "digest": json.loads(plan.read_text())["experiment_digest"]}))
        (attempt / "log.jsonl").write_text(
            "".join(json.dumps({"update": k, "score": 0.5}) + "\n" for k in (1, 2)))
        proc.kill()
        proc.wait(timeout=10)
        _wait_for(lambda: not _group_members(pgid), 5,
                  "the engine's process group outlived the killed `run`")
        _wait_for(lambda: (attempt / "result.json").exists() and
                  not (attempt / ".running").exists(), 30,
                  "nobody recorded the attempt of the killed `run`")
    finally:
        proc.kill()
        if "pgid" in locals():
            _kill_group(pgid)

    result = json.loads((attempt / "result.json").read_text())
    assert result["status"] == "interrupted" and result["committed_updates"] == 2
    assert result["exit_code"] is None
    exit_check = next(c for c in result["checks"] if c["name"] == "exit_code")
    assert "the `run` process was killed" in exit_check["detail"]
    assert json.loads((runs / run_id / "result.json").read_text()) == result
    assert "recorded as interrupted after 2/3 updates" in (attempt / "orphaned.log").read_text()
    assert not _processes_with("providers/tether.py", str(attempt))  # the tether is done

    shown = cli("runs", "show", "--json", "--runs-dir", runs, run_id)
    (doc,) = json.loads(shown.stdout)["attempts"]
    assert doc["status"] == "interrupted" and doc["committed_updates"] == 2
    assert doc["reason"] == "interrupted after update 2"
    listed = json.loads(cli("runs", "list", "--json", "--runs-dir", runs).stdout)
    (row,) = listed["runs"] if isinstance(listed, dict) else listed
    assert row["status"] == "interrupted" and row["committed_updates"] == 2
    again = cli("run", "--runs-dir", runs, plan)
    assert again.returncode == 2 and "attempt 1 ended interrupted after 2/3 updates" in \
        again.stderr, again.stderr


def test_a_run_that_ends_itself_leaves_no_tether(cli, hanging_echo, tmp_path):
    """Ctrl-C stops the engine as before, and the tether leaves with `run`."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "stateset_backend", "run", "--quiet",
                             "--engine", "echo", "--runs-dir", str(runs), str(hanging_echo)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: bool(list(runs.glob("*/attempts/1/marker"))) or
                  proc.poll() is not None, 60, "the engine never started")
        assert proc.poll() is None, proc.communicate()
        (attempt,) = runs.glob("*/attempts/1")
        _wait_for(lambda: bool(_processes_with("providers/tether.py", str(attempt))), 10,
                  "no tether watches the engine")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        proc.kill()
    assert json.loads((attempt / "result.json").read_text())["status"] == "interrupted"
    assert not _processes_with("providers/tether.py", str(attempt))
    assert not (attempt / "orphaned.log").exists() and not (attempt / ".running").exists()


def test_an_attempt_whose_tether_died_too_is_recorded_by_the_next_run(
        cli, hanging_echo, tmp_path):
    """A whole process tree killed at once: the engine's leader still gets its parent-death
    signal, and the next `run` of the plan records the attempt its lock shows abandoned."""
    runs, plan, run_id, attempt, proc = _start_run(cli, hanging_echo, tmp_path)
    try:
        _wait_for(lambda: (attempt / "marker").exists() and
                  bool(_processes_with("providers/tether.py", str(attempt))), 60,
                  "the engine or its tether never started")
        (engine,) = _processes_with("stateset_echo_engine.engine", str(runs))
        pgid = os.getpgid(engine)
        running = cli("runs", "show", "--json", "--runs-dir", runs, run_id)
        assert json.loads(running.stdout)["attempts"][0]["reason"] == \
            "no result.json yet: its `run` process is running"
        (tethered,) = _processes_with("providers/tether.py", str(attempt))
        os.kill(tethered, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=10)
        _wait_for(lambda: not _group_members(pgid), 5, "the engine outlived `run`")
    finally:
        proc.kill()
        if "pgid" in locals():
            _kill_group(pgid)
    assert not (attempt / "result.json").exists()
    shown = cli("runs", "show", "--json", "--runs-dir", runs, run_id)
    assert "was killed before recording it" in json.loads(shown.stdout)["attempts"][0]["reason"]

    retried = cli("run", "--retry", "--timeout", "1", "--runs-dir", runs, plan)
    assert retried.returncode == 4, retried.stderr  # attempt 2 hangs and times out
    first = json.loads((attempt / "result.json").read_text())
    assert first["status"] == "interrupted" and first["attempt"] == 1
    assert json.loads((runs / run_id / "result.json").read_text())["attempt"] == 2
    assert not (attempt / ".running").exists()


DRIVER = """
import sys
from pathlib import Path
from stateset_backend.providers.local import run_local

folder = Path(sys.argv[1])
run_local(["sh", "-c", "sleep 300 & echo $! > child; sleep 300"], cwd=folder,
          env={"PATH": "/usr/bin:/bin"}, stdout_path=folder / "stdout.log",
          stderr_path=folder / "stderr.log")
"""


def test_a_killed_caller_of_run_local_takes_the_whole_group(tmp_path):
    """Not the leader alone (the parent-death signal reaches only that): its children too."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)])
    try:
        _wait_for(lambda: (tmp_path / "child").exists() and
                  (tmp_path / "child").read_text().strip() != "", 30, "the group never started")
        child = int((tmp_path / "child").read_text())
        pgid = os.getpgid(child)
        assert child in _group_members(pgid) and pgid != os.getpgid(driver.pid)
        driver.kill()
        driver.wait(timeout=10)
        _wait_for(lambda: not _group_members(pgid), 5,
                  "the engine's children outlived the killed caller")
    finally:
        driver.kill()
        if "pgid" in locals():
            _kill_group(pgid)


@pytest.mark.slow
def test_a_killed_native_run_resumes_from_its_newest_checkpoint(cli, tmp_path):
    """A real trainer parked in its reward after a checkpoint: after SIGKILL of `run` the
    attempt holds the updates it committed and `run PLAN --resume` continues it."""
    from interrupting import HOLD_WHEN, write_holding_reward
    from native.conftest import tiny_spec

    doc = tiny_spec(**{"budget.total_updates": 6, "evaluation.every": None})
    reward = write_holding_reward(tmp_path / "reward.py", Path(
        doc["reward"]["entrypoint"].rpartition(":")[0]).read_text())
    doc["reward"].update(entrypoint=f"{reward}:score",
                         sha256=hashlib.sha256(reward.read_bytes()).hexdigest())
    spec, plan, runs = tmp_path / "spec.json", tmp_path / "plan.json", tmp_path / "runs"
    spec.write_text(json.dumps(doc))
    assert cli("plan", "--engine", "native", spec, "-o", plan).returncode == 0
    run_id = json.loads(plan.read_text())["run_id"]
    attempt = runs / run_id / "attempts" / "1"
    sealed = attempt / "checkpoints" / "update-000002" / "manifest.json"
    proc = subprocess.Popen([sys.executable, "-m", "stateset_backend", "run", "--quiet",
                             "--runs-dir", str(runs), str(plan)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, HOLD_WHEN: str(sealed)})
    try:
        _wait_for(sealed.exists, 300, "the run never sealed its checkpoint")
        (engine,) = _processes_with("stateset_backend.native", str(attempt))
        pgid = os.getpgid(engine)
        proc.kill()
        proc.wait(timeout=10)
        _wait_for(lambda: not _group_members(pgid), 10, "the trainer outlived `run`")
        _wait_for(lambda: (attempt / "result.json").exists() and
                  not (attempt / ".running").exists(), 60, "the attempt went unrecorded")
    finally:
        proc.kill()
        if "pgid" in locals():
            _kill_group(pgid)
    first = json.loads((attempt / "result.json").read_text())
    assert first["status"] == "interrupted" and 2 <= first["committed_updates"] < 6

    resumed = cli("run", "--runs-dir", runs, "--resume", "--quiet", plan, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((runs / run_id / "result.json").read_text())
    assert result["attempt"] == 2 and result["status"] == "succeeded"
    assert result["resumed_from"]["attempt"] == 1 and result["resumed_from"]["update"] >= 2
    assert not any("left no readable result.json" in w for w in result["warnings"])
