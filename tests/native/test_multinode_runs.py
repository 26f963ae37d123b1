"""The native engine across nodes, with real processes on loopback: two torchrun agents, each
its own process group as on two machines, meet at a c10d rendezvous and share one run directory
as a shared filesystem; they train what one node of two processes trains, and rank 0 alone
writes every record. When one node's agent is killed, the other node fails within a bound
instead of waiting or training on."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
import torch

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(__name__)]

UPDATES = 6
RUN_ID = "20260101T000000Z-0000abcd"
LOOPBACK = "127.0.0.1"
TIMING = ("tokens_per_second", "time/update_s")  # wall-clock measurements, not results


def _conftest() -> Any:
    where = importlib.util.spec_from_file_location("native_conftest",
                                                   Path(__file__).with_name("conftest.py"))
    assert where is not None and where.loader is not None
    conftest = importlib.util.module_from_spec(where)
    where.loader.exec_module(conftest)
    return conftest


def free_port() -> int:
    """A port free on the loopback interface now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def reward(tmp_path_factory) -> dict[str, Any]:
    """A reward that differs within every group: every update has a learning signal."""
    return dict(_conftest().signal_reward(tmp_path_factory.mktemp("reward")))


def _doc(resources: dict[str, Any], reward: dict[str, Any], updates: int) -> dict[str, Any]:
    # 3 groups on 2 ranks: uneven blocks, whichever node holds which rank
    return dict(_conftest().tiny_spec(**{
        "budget.total_updates": updates, "budget.prompts_per_update": 3,
        "checkpoint.every": 2, "evaluation.every": 3, "reward": reward,
        "resources": resources}))


def _launch(doc: dict[str, Any], run_dir: Path) -> tuple[list[str], str]:
    """The plan's launch as a provider that starts torchrun on every node gets it: files
    written into the run directory, placeholders filled; and the experiment digest."""
    from packaging.version import Version

    from stateset_backend.adapters.native.adapter import NativeAdapter
    from stateset_backend.engines.adapter import PYTHON, RUN_DIR, LaunchContext
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec
    from stateset_backend.translate.rules import translate

    spec, adapter = parse_spec(doc), NativeAdapter()
    dialect = adapter.contract.dialect(Version("0.1.0"))
    translation = translate(spec, adapter.rules(dialect), dialect, "native", "0.1.0")
    digest = experiment_digest(spec)
    launch = adapter.render(translation, spec, LaunchContext(
        RUN_ID, digest, "0.1.0", dialect, None, "slurm"))
    run_dir.mkdir(parents=True)
    for rel, text in launch.files.items():
        (run_dir / rel).write_text(text, encoding="utf-8")
    argv = [a.replace(RUN_DIR, str(run_dir)).replace(PYTHON, sys.executable)
            for a in launch.argv]
    return argv, digest


def _env() -> dict[str, str]:
    # gloo's connections on the loopback interface; one thread per rank on a small machine
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "STATESET_BACKEND_PROGRESS": "lines"}


def _start_nodes(argv: list[str], nodes: int, run_dir: Path, logs: Path,
                 rendezvous_id: str) -> list[subprocess.Popen[bytes]]:
    """One torchrun agent per node, each in a process group of its own, node 0 first. Node 0
    hosts the rendezvous, as the first node of a cluster does (on loopback every agent would
    take itself for the endpoint's host; the first to bind the port would win)."""
    from stateset_backend.adapters.native.adapter import node_argv

    endpoint = f"{LOOPBACK}:{free_port()}"
    agents = []
    for rank in range(nodes):
        node = node_argv(argv, node_rank=rank, endpoint=endpoint, rendezvous_id=rendezvous_id,
                         local_addr=LOOPBACK)
        engine = node.index("-m", 3)
        node.insert(engine, f"--rdzv-conf=is_host={int(rank == 0)}")
        log = (logs / f"node-{rank}.log").open("wb")
        agents.append(subprocess.Popen(
            node, cwd=run_dir, env=_env(), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
    return agents


def _ranks(run_dir: Path) -> dict[int, int]:
    """{rank: pid} of this run's engine processes still alive (their torchrun environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = dict(item.split(b"=", 1) for item in
                           (entry / "environ").read_bytes().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if b"stateset_backend.native" in cmdline and str(run_dir).encode() in cmdline \
                and b"RANK" in environ and b"torch.distributed.run" not in cmdline:
            found[int(environ[b"RANK"])] = int(entry.name)
    return found


def _stop(agents: list[subprocess.Popen[bytes]], run_dir: Path) -> None:
    """Whatever is left of these agents and their ranks (each rank has a session of its own)."""
    for agent in agents:
        if agent.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(timeout=30)
    for pid in _ranks(run_dir).values():
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _run(argv: list[str], nodes: int, run_dir: Path, logs: Path) -> float:
    agents = _start_nodes(argv, nodes, run_dir, logs, "run-" + run_dir.parent.name)
    started = time.monotonic()
    try:
        codes = [agent.wait(timeout=600) for agent in agents]
    finally:
        _stop(agents, run_dir)
    text = "\n".join((logs / f"node-{n}.log").read_text(errors="replace")
                     for n in range(nodes))
    assert codes == [0] * nodes, text[-6000:]
    return time.monotonic() - started


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def two_nodes_and_one(tmp_path_factory, reward) -> dict[str, Any]:
    """The same experiment as 2 nodes x 1 process and as 1 node x 2 processes."""
    out: dict[str, Any] = {}
    for name, nodes, resources in (("two_nodes", 2, {"nodes": 2, "processes_per_node": 1}),
                                   ("one_node", 1, {"processes_per_node": 2})):
        tmp = tmp_path_factory.mktemp(name)
        run_dir = tmp / "run"
        argv, digest = _launch(_doc(resources, reward, UPDATES), run_dir)
        seconds = _run(argv, nodes, run_dir, tmp)
        out[name] = {"dir": run_dir, "digest": digest, "argv": argv, "seconds": seconds}
    return out


def test_two_nodes_train_the_one_node_weights_and_write_each_record_once(two_nodes_and_one):
    two, one = two_nodes_and_one["two_nodes"], two_nodes_and_one["one_node"]
    assert two["digest"] == one["digest"]  # where the ranks run is not identity
    assert "--nnodes=2" in two["argv"] and "--standalone" in one["argv"]
    a, b = _tree(two["dir"]), _tree(one["dir"])
    # the same files: no rank other than rank 0 wrote, no node left a temporary behind (the
    # TensorBoard event file is named after the writing host and time: one in each)
    events = [[p for p in t if p.startswith("tensorboard/")] for t in (a, b)]
    assert [len(e) for e in events] == [1, 1]
    names = sorted(p for p in a if not p.startswith("tensorboard/"))
    assert names == sorted(p for p in b if not p.startswith("tensorboard/"))
    assert not [p for p in names if any(part.startswith(".") for part in Path(p).parts)]
    (weights,) = [p for p in names if p.startswith("final/") and p.endswith(".safetensors")]
    assert hashlib.sha256(a[weights]).hexdigest() == hashlib.sha256(b[weights]).hexdigest()
    # every checkpoint (weights, optimizer, runtime: world size 2 and each rank's position),
    # every trajectory and receipt, the final model and run_info: byte for byte. Not compared
    # whole: the metrics' timings, the config's resources, and Python's global random state
    # in rng.pt, which nothing draws from and each interpreter seeds from the OS
    for name in names:
        if name.endswith("rng.pt"):
            mine, theirs = torch.load(io.BytesIO(a[name]), weights_only=False), \
                torch.load(io.BytesIO(b[name]), weights_only=False)
            assert all(torch.equal(mine[k], theirs[k]) for k in ("torch", "generator")), name
        elif name.endswith("manifest.json"):
            mine, theirs = json.loads(a[name]), json.loads(b[name])
            for doc in (mine, theirs):
                doc["files"].pop("rng.pt")
            assert mine == theirs, name
        elif name not in ("metrics.jsonl", "native_config.json"):
            assert a[name] == b[name], name
    # one row per step, as one process writes them, with the same values
    rows = {k: [json.loads(x) for x in v.decode().splitlines()]
            for k, v in (("two", a["metrics.jsonl"]), ("one", b["metrics.jsonl"]))}
    assert [r["step"] for r in rows["two"]] == [0, *range(1, UPDATES + 1)]
    drop = [{k: v for k, v in r.items() if k not in TIMING} for r in rows["two"]]
    assert drop == [{k: v for k, v in r.items() if k not in TIMING} for r in rows["one"]]
    receipts = a["receipts.jsonl"].decode().splitlines()
    assert [json.loads(r)["update"] for r in receipts] == list(range(1, UPDATES + 1))
    assert sorted(p for p in a if p.startswith("trajectories/")) == \
        [f"trajectories/update-{u:06d}.jsonl" for u in range(1, UPDATES + 1)]
    for update in range(1, UPDATES + 1):
        lines = a[f"trajectories/update-{update:06d}.jsonl"].decode().splitlines()
        assert len(lines) == 3 * 4  # every group's samples once, from both nodes' ranks
    runtime = json.loads(a["checkpoints/update-000004/runtime.json"])
    assert runtime["world_size"] == 2 and [r["rank"] for r in runtime["ranks"]] == [0, 1]
    info = json.loads(a["run_info.json"])
    assert info["committed_updates"] == UPDATES and info["run_id"] == RUN_ID


def test_killing_one_nodes_agent_fails_the_other_node_within_a_bound(tmp_path, reward):
    """Node 1's agent is SIGKILLed after the update-2 checkpoint; its rank dies with it (it
    would otherwise train on as an orphan), and node 0 fails at its next collective."""
    run_dir = tmp_path / "run"
    updates = 40  # far more than can pass between the checkpoint and the kill
    argv, _ = _launch(_doc({"nodes": 2, "processes_per_node": 1}, reward, updates), run_dir)
    agents = _start_nodes(argv, 2, run_dir, tmp_path, "killed")
    try:
        deadline = time.monotonic() + 300
        manifest = run_dir / "checkpoints" / "update-000002" / "manifest.json"
        while not manifest.exists():
            assert time.monotonic() < deadline and all(a.poll() is None for a in agents), \
                (tmp_path / "node-0.log").read_text(errors="replace")[-4000:]
            time.sleep(0.02)
        os.kill(agents[1].pid, signal.SIGKILL)  # the agent alone, not its process group
        killed = time.monotonic()
        code = agents[0].wait(timeout=120)
        bound = time.monotonic() - killed
        gone_by = time.monotonic() + 30
        while _ranks(run_dir) and time.monotonic() < gone_by:
            time.sleep(0.1)
        left = _ranks(run_dir)
    finally:
        _stop(agents, run_dir)
    log = (tmp_path / "node-0.log").read_text(errors="replace")
    assert code not in (0, 75), log[-4000:]
    assert bound < 120
    assert left == {}, f"ranks outlived their agents: {left}"
    info = json.loads((run_dir / "run_info.json").read_text())
    assert 2 <= info["committed_updates"] < updates
    assert not (run_dir / "final").exists()
    assert "native engine (rank" in log  # the surviving rank says why it stopped
    assert not (run_dir / "quarantine.json").exists()  # a lost peer is a failure, resumable
