"""The native engine across two Slurm nodes (two slurmd on this host, one CPU each:
tests/slurm_cluster.py): 2 nodes x 1 process train bit for bit what 1 node x 2 processes
train. Nothing here sets OMP_NUM_THREADS: the job chooses each process's threads from the CPUs
Slurm gave it, the same on every layout, and every checkpoint records the count."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from slurm_cluster import ON_ONE_WORKER, RAY_AUTH_VARS, slurm_two_nodes  # noqa: F401

from stateset_backend.cli import main

pytestmark = [pytest.mark.slow, ON_ONE_WORKER]


def _spec(tmp_path: Path, name: str, nodes: int, processes: int) -> Path:
    from native.conftest import tiny_spec

    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(tiny_spec(**{
        "resources": {"nodes": nodes, "processes_per_node": processes},
        "checkpoint.every": 3})))
    return path


def _final(runs: Path) -> tuple[str, list[int]]:
    (attempt,) = runs.glob("*/attempts/1")
    weights = hashlib.sha256((attempt / "final" / "model.safetensors").read_bytes()).hexdigest()
    runtimes = [json.loads(p.read_text()) for p in sorted(attempt.rglob("runtime.json"))]
    assert runtimes, "no checkpoint recorded its runtime"
    return weights, sorted({r["intra_op_threads"] for rt in runtimes for r in rt["ranks"]})


def test_two_nodes_train_what_one_node_of_two_processes_trains(
        slurm_two_nodes, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("SLURM_CONF", str(slurm_two_nodes.conf))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the job's own choice, not ours
    for name in RAY_AUTH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # the ranks' traffic stays on loopback
    one, two = tmp_path / "one-node", tmp_path / "two-nodes"
    assert main(["run", "--engine", "native", str(_spec(tmp_path, "one", 1, 2)),
                 "--runs-dir", str(one), "--quiet"]) == 0
    assert main(["run", "--engine", "native", str(_spec(tmp_path, "two", 2, 1)),
                 "--runs-dir", str(two), "--quiet", "--provider", "slurm",
                 "--slurm-shared-root", "/", "--slurm-time", "00:10:00"]) == 0
    err = capsys.readouterr().err
    (attempt,) = two.glob("*/attempts/1")
    job = (attempt / "slurm" / "job_id").read_text().strip()
    shown = slurm_two_nodes.run("scontrol", "show", "job", "-o", job).stdout
    assert "NumNodes=2 " in shown and "NodeList=node[1-2]" in shown, shown
    port = (attempt / "slurm" / "ports").read_text().split("=")[1].strip()
    assert f"rendezvous on 127.0.0.1:{port}" in (attempt / "stderr.log").read_text() + err
    assert _final(two) == _final(one)
    assert _final(two)[1] == [1]  # one CPU per process, so one thread, on both layouts
