"""The ray provider against a real Ray head on loopback, in Ray's secure setup (token
authentication): the native engine runs as a Ray job on the CPU, its outputs are collected and
checked like any local run, the token reaches the job client from the user's environment or
token file and nowhere else, and a cluster that refuses is one line naming the fix. Ray's home
and environment are the test's own, so a token of the user running the tests can neither break
nor leak into them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from slurm_cluster import ON_ONE_WORKER, RAY_AUTH_VARS

ray = pytest.importorskip("ray.job_submission", reason="ray is not installed")
pytestmark = ON_ONE_WORKER

DASHBOARD_PORT = 8399
TOKEN = "stateset-test-" + os.urandom(16).hex()


@pytest.fixture(scope="module")
def token_home(tmp_path_factory) -> Path:
    """A home whose ~/.ray/auth_token holds the test cluster's token, as `ray get-auth-token
    --generate` leaves it."""
    home = tmp_path_factory.mktemp("home-with-token")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(TOKEN + "\n")
    return home


@pytest.fixture(autouse=True)
def own_ray_home(tmp_path, monkeypatch):
    """No token or auth mode of the user's reaches a test, nor a CLI it starts."""
    for name in RAY_AUTH_VARS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _no_token_in(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


@pytest.fixture(scope="module")
def ray_head(token_home):
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        ray_cli = Path(shutil.which("ray") or "ray")
    # Ray's sockets live under its temp dir, and a Unix socket's path holds at most 107 bytes:
    # a short folder of its own, not one under pytest's (longer with each xdist worker's name)
    temp = Path(tempfile.mkdtemp(prefix="ray-"))
    try:
        # hermetic: the head's token is the test's, read from the test's home
        env = {k: v for k, v in os.environ.items() if k not in RAY_AUTH_VARS}
        env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", HOME=str(token_home))
        subprocess.run([str(ray_cli), "start", "--head", "--node-ip-address=127.0.0.1",
                        "--port=6399", f"--dashboard-port={DASHBOARD_PORT}",
                        "--dashboard-host=127.0.0.1", "--include-dashboard=true", "--num-cpus=2",
                        f"--temp-dir={temp}", "--disable-usage-stats"],
                       check=True, capture_output=True, env=env, timeout=180)
        address = f"http://127.0.0.1:{DASHBOARD_PORT}"
        deadline = time.monotonic() + 120
        while True:
            try:
                ray.JobSubmissionClient(address, headers={
                    "Authorization": f"Bearer {TOKEN}"}).list_jobs()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield address
    finally:
        subprocess.run([str(ray_cli), "stop", "--force"], capture_output=True, timeout=120,
                       env=env)
        shutil.rmtree(temp, ignore_errors=True)


def test_native_engine_runs_as_a_ray_job_with_the_users_token_file(cli, ray_head, token_home,
                                                                     tmp_path, monkeypatch):
    from native.conftest import tiny_spec

    monkeypatch.setenv("HOME", str(token_home))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(tiny_spec(**{"budget.total_updates": 3})))
    runs = tmp_path / "runs"
    proc = cli("run", "--engine", "native", "--provider", "ray", "--ray-address", ray_head,
               "--runs-dir", runs, spec, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (result_path,) = runs.glob("*/result.json")
    result = json.loads(result_path.read_text())
    assert result["provider"] == "ray" and result["status"] == "succeeded"
    assert result["committed_updates"] == 3
    client = ray.JobSubmissionClient(ray_head, headers={"Authorization": f"Bearer {TOKEN}"})
    job = client.get_job_info(f"stateset-{result['run_id']}-1")
    assert str(job.status) in ("SUCCEEDED", "JobStatus.SUCCEEDED")
    assert TOKEN not in json.dumps(job.runtime_env or {})  # the job's environment has none
    _no_token_in(runs)
    assert TOKEN not in proc.stdout + proc.stderr


def test_a_failing_ray_job_is_a_failed_run_with_the_token_from_the_environment(
        cli, ray_head, tmp_path, monkeypatch):
    from native.conftest import tiny_spec

    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    from stateset_backend.spec.content import sha256_file

    broken = tmp_path / "reward.py"  # plans fine, fails inside the engine on the cluster
    broken.write_text("raise RuntimeError('this reward cannot be imported')\n")
    doc = tiny_spec()
    doc["reward"] = {"kind": "python", "entrypoint": f"{broken}:score",
                     "sha256": sha256_file(broken)}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(doc))
    runs = tmp_path / "runs"
    proc = cli("run", "--engine", "native", "--provider", "ray", "--ray-address", ray_head,
               "--runs-dir", runs, spec, timeout=600)
    assert proc.returncode == 4, proc.stderr
    (result_path,) = runs.glob("*/result.json")
    assert json.loads(result_path.read_text())["status"] == "failed"
    _no_token_in(runs)


@pytest.mark.parametrize("token, said", [
    (None, "no token was found"),
    ("not-the-clusters-token", "refused the token from RAY_AUTH_TOKEN"),
    ("disabled", "RAY_AUTH_MODE=disabled sends no token: unset it and put"),
])
def test_a_cluster_that_refuses_is_one_line_naming_the_fix(cli, ray_head, token_home, tmp_path,
                                                           monkeypatch, token, said):
    from native.conftest import tiny_spec

    if token == "disabled":  # the right token is at hand, but the user switched tokens off
        monkeypatch.setenv("HOME", str(token_home))
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    elif token is not None:
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(tiny_spec()))
    proc = cli("run", "--engine", "native", "--provider", "ray", "--ray-address", ray_head,
               "--runs-dir", tmp_path / "runs", spec, timeout=300)
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "RAY_AUTH_TOKEN or ~/.ray/auth_token" in last
    assert said in last
    assert TOKEN not in proc.stderr and (token in (None, "disabled") or token not in proc.stderr)
    (result,) = (tmp_path / "runs").glob("*/attempts/1/result.json")  # nothing ran: said so
    exit_check, = [c for c in json.loads(result.read_text())["checks"] if c["name"] == "exit_code"]
    assert "RAY_AUTH_TOKEN or ~/.ray/auth_token" in exit_check["detail"]


def test_an_unreachable_cluster_is_one_clear_error(cli, tmp_path):
    from native.conftest import tiny_spec

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(tiny_spec()))
    proc = cli("run", "--engine", "native", "--provider", "ray", "--ray-address",
               "http://127.0.0.1:9", "--runs-dir", tmp_path / "runs", spec, timeout=300)
    assert proc.returncode == 4
    last = proc.stderr.strip().splitlines()[-1]
    assert "failed: never started: cannot submit to the Ray cluster" in last, last
    assert "engine exited" not in last and "identity" not in last  # nothing ran to check
    (result,) = (tmp_path / "runs").glob("*/attempts/1/result.json")
    doc = json.loads(result.read_text())
    assert doc["status"] == "failed" and doc["exit_code"] is None
