"""The ray provider against a real Ray head on loopback: the native engine runs as a Ray job
on the CPU, its outputs are collected and checked like any local run."""

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
from slurm_cluster import ON_ONE_WORKER

ray = pytest.importorskip("ray.job_submission", reason="ray is not installed")
pytestmark = ON_ONE_WORKER

DASHBOARD_PORT = 8399


@pytest.fixture(scope="module")
def ray_head():
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        ray_cli = Path(shutil.which("ray") or "ray")
    # Ray's sockets live under its temp dir, and a Unix socket's path holds at most 107 bytes:
    # a short folder of its own, not one under pytest's (longer with each xdist worker's name)
    temp = Path(tempfile.mkdtemp(prefix="ray-"))
    try:
        # hermetic: a token left in ~/.ray by any earlier local Ray would otherwise switch
        # this head to token auth, and the Jobs client here carries none
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        subprocess.run([str(ray_cli), "start", "--head", "--node-ip-address=127.0.0.1",
                        "--port=6399", f"--dashboard-port={DASHBOARD_PORT}",
                        "--dashboard-host=127.0.0.1", "--include-dashboard=true", "--num-cpus=2",
                        f"--temp-dir={temp}", "--disable-usage-stats"],
                       check=True, capture_output=True, env=env, timeout=180)
        address = f"http://127.0.0.1:{DASHBOARD_PORT}"
        deadline = time.monotonic() + 120
        while True:
            try:
                ray.JobSubmissionClient(address).list_jobs()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield address
    finally:
        subprocess.run([str(ray_cli), "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def test_native_engine_runs_as_a_ray_job(cli, ray_head, tmp_path):
    from native.conftest import tiny_spec

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
    client = ray.JobSubmissionClient(ray_head)
    job = client.get_job_info(f"stateset-{result['run_id']}-1")
    assert str(job.status) in ("SUCCEEDED", "JobStatus.SUCCEEDED")


def test_a_failing_ray_job_is_a_failed_run(cli, ray_head, tmp_path):
    from native.conftest import tiny_spec

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


def test_an_unreachable_cluster_is_one_clear_error(cli, tmp_path):
    from native.conftest import tiny_spec

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(tiny_spec()))
    proc = cli("run", "--engine", "native", "--provider", "ray", "--ray-address",
               "http://127.0.0.1:9", "--runs-dir", tmp_path / "runs", spec, timeout=300)
    assert proc.returncode == 4
    assert "cannot submit to the Ray cluster" in proc.stderr.strip().splitlines()[-1]
