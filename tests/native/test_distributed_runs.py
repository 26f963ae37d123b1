"""Real 2-process gloo runs through the CLI: they train the 1-process weights; only rank 0
writes; a SIGKILL of one rank fails the whole attempt (exit 4); a resume continues exactly
(the final weights equal an uninterrupted run's) and is refused (exit 6) when the runtime
changed, unless only package versions changed and the user allowed it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(__name__)]

UPDATES = 12


def _conftest() -> Any:
    where = importlib.util.spec_from_file_location("native_conftest",
                                                   Path(__file__).with_name("conftest.py"))
    assert where is not None and where.loader is not None
    conftest = importlib.util.module_from_spec(where)
    where.loader.exec_module(conftest)
    return conftest


@pytest.fixture(scope="module")
def reward(tmp_path_factory) -> dict[str, Any]:
    """A reward that differs within every group, so every update has a learning signal. With
    the task reward nearly always 0, an early update's only gradient is the KL term at
    policy == reference: rounding noise, which Adam scales up to a full step whose direction
    depends on how the batch was split, so 1 and 2 processes would differ by luck."""
    return dict(_conftest().signal_reward(tmp_path_factory.mktemp("reward")))


def _spec(processes: int | None, reward: dict[str, Any]) -> dict[str, Any]:
    # 3 groups on 2 ranks: uneven blocks, so averaging the ranks' losses (as plain DDP does)
    # instead of weighting them by their share would show in the weights
    return dict(_conftest().tiny_spec(**{
        "budget.total_updates": UPDATES, "budget.prompts_per_update": 3,
        "checkpoint.every": 2, "evaluation.every": 6, "reward": reward,
        "resources.processes_per_node": processes}))


def _cli(*args: Any, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stateset_backend", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _plan(tmp: Path, doc: dict[str, Any]) -> tuple[Path, str]:
    spec, plan = tmp / "spec.json", tmp / "plan.json"
    spec.write_text(json.dumps(doc))
    proc = _cli("plan", "--engine", "native", spec, "-o", plan)
    assert proc.returncode == 0, proc.stderr
    return plan, json.loads(plan.read_text())["run_id"]


def _final_weights(attempt: Path) -> dict[str, torch.Tensor]:
    (weights,) = (attempt / "final").glob("*.safetensors")
    return load_file(str(weights))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, reward):
    """One uninterrupted 2-process run, shared below."""
    tmp = tmp_path_factory.mktemp("ddp")
    plan, run_id = _plan(tmp, _spec(2, reward))
    proc = _cli("run", "--runs-dir", tmp / "runs", "--quiet", plan)
    assert proc.returncode == 0, proc.stderr
    return tmp / "runs" / run_id / "attempts" / "1"


def test_two_gloo_processes_train_the_one_process_weights(uninterrupted, reward, tmp_path):
    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec

    spec = parse_spec(_spec(None, reward))
    trainer = Trainer(RunSettings("20260101T000000Z-00000000", experiment_digest(spec), spec,
                                  tmp_path), tmp_path)
    trainer.train()
    two = _final_weights(uninterrupted)
    one = {n: t for n, t in trainer.model.state_dict().items() if n in two}
    assert set(one) == set(two)
    worst = max(float((one[n] - two[n]).abs().max()) for n in two)
    assert worst < 1e-5, f"2 processes differ from 1 by up to {worst}"
    assert any(float((two[n] - trainer.reference.state_dict()[n]).abs().max()) > 1e-3
               for n in two)  # it trained: the comparison is not between two initial models
    # the same prompts, groups and samples, recorded once, by rank 0
    assert (uninterrupted / "receipts.jsonl").read_text() == \
        (tmp_path / "receipts.jsonl").read_text()
    for mine in sorted((tmp_path / "trajectories").iterdir()):
        assert (uninterrupted / "trajectories" / mine.name).read_text() == mine.read_text()
    rows = [json.loads(x) for x in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, *range(1, UPDATES + 1)]
    assert [r["step"] for r in rows if "val/reward/mean" in r] == [0, 6, 12]


def test_a_checkpoint_records_its_runtime_and_each_ranks_data_position(uninterrupted):
    runtime = json.loads((uninterrupted / "checkpoints" / "update-000004" /
                          "runtime.json").read_text())
    assert runtime["world_size"] == 2
    assert set(runtime["versions"]) == {"torch", "transformers", "stateset-backend"}
    assert runtime["versions"]["torch"] == torch.__version__
    assert runtime["model"]["path"].startswith("builtin:")
    assert [r["rank"] for r in runtime["ranks"]] == [0, 1]
    assert [r["groups"] for r in runtime["ranks"]] == [[0, 1], [1, 3]]
    assert runtime["ranks"][0]["sampler"] == runtime["ranks"][1]["sampler"]
    manifest = json.loads((uninterrupted / "checkpoints" / "update-000004" /
                           "manifest.json").read_text())
    assert "runtime.json" in manifest["files"]  # hashed like the rest


def _rank_pid(attempt: Path, rank: int) -> int | None:
    """The engine process of ``rank`` in this attempt (its torchrun environment says so)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = dict(item.split(b"=", 1) for item in
                           (entry / "environ").read_bytes().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if b"stateset_backend.native" in cmdline and str(attempt).encode() in b" ".join(
                cmdline) and environ.get(b"RANK") == str(rank).encode():
            return int(entry.name)
    return None


@pytest.fixture(scope="module")
def killed(tmp_path_factory, reward):
    """A 2-process run whose rank 1 was SIGKILLed after the update-4 checkpoint."""
    tmp = tmp_path_factory.mktemp("killed")
    plan, run_id = _plan(tmp, _spec(2, reward))
    runs = tmp / "runs"
    attempt = runs / run_id / "attempts" / "1"
    proc = subprocess.Popen([sys.executable, "-m", "stateset_backend", "run", "--runs-dir",
                             str(runs), "--quiet", str(plan)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline, pid = time.monotonic() + 180, None
    # find the rank first (a /proc scan is slow on a busy machine), then kill it the moment
    # the checkpoint is complete, well before the last update
    while pid is None or not (attempt / "checkpoints" / "update-000004" /
                              "manifest.json").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        if pid is None and attempt.exists():
            pid = _rank_pid(attempt.resolve(), 1)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    return {"plan": plan, "runs": runs, "run_id": run_id, "returncode": proc.returncode,
            "stderr": stderr, "attempt": attempt}


def test_killing_one_rank_fails_the_whole_attempt(killed):
    assert killed["returncode"] == 4, killed["stderr"]
    result = json.loads((killed["runs"] / killed["run_id"] / "result.json").read_text())
    assert result["status"] == "failed"
    assert result["committed_updates"] < UPDATES
    assert _rank_pid(killed["attempt"].resolve(), 0) is None  # rank 0 did not outlive it
    assert not (killed["attempt"] / "final").exists()


def _copy(killed, tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(killed["runs"], runs)
    return runs


def test_a_resume_under_another_world_size_or_versions_is_exit_6(killed, tmp_path,
                                                                 monkeypatch, capsys):
    from stateset_backend.adapters.native import adapter as native
    from stateset_backend.cli import main

    runs = _copy(killed, tmp_path)
    real = native.NativeAdapter.current_runtime

    def one_process(self, spec, python=None):
        return {**real(self, spec, python), "world_size": 1}

    monkeypatch.setattr(native.NativeAdapter, "current_runtime", one_process)
    argv = ["run", "--runs-dir", str(runs), "--resume", "--quiet", str(killed["plan"])]
    assert main([*argv, "--allow-runtime-change"]) == 6
    assert "world_size: the checkpoint has 2, this launch 1" in capsys.readouterr().err
    monkeypatch.setattr(native.NativeAdapter, "current_runtime", real)

    installed = native.distribution_version
    monkeypatch.setattr(native, "distribution_version",
                        lambda name, python=None: "0.0.1" if name == "torch" else
                        installed(name, python))
    assert main(argv) == 6
    err = capsys.readouterr().err
    assert f"torch {torch.__version__} -> 0.0.1" in err and "--allow-runtime-change" in err
    assert sorted(p.name for p in (runs / killed["run_id"] / "attempts").iterdir()) == ["1"]


def test_a_package_change_the_user_allows_is_a_warning_in_the_result(killed, tmp_path,
                                                                     monkeypatch, capsys):
    from stateset_backend.adapters.native import adapter as native
    from stateset_backend.cli import main

    runs = _copy(killed, tmp_path)
    installed = native.distribution_version
    monkeypatch.setattr(native, "distribution_version",
                        lambda name, python=None: "9.9.9" if name == "transformers" else
                        installed(name, python))
    assert main(["run", "--runs-dir", str(runs), "--resume", "--quiet",
                 "--allow-runtime-change", str(killed["plan"])]) == 0
    result = json.loads((runs / killed["run_id"] / "result.json").read_text())
    assert result["status"] == "succeeded" and result["attempt"] == 2
    (warning,) = result["warnings"]
    assert "transformers" in warning and "-> 9.9.9" in warning
    assert "warning: resumed under changed package versions" in capsys.readouterr().out


def test_resume_after_the_kill_continues_exactly(killed, uninterrupted):
    proc = _cli("run", "--runs-dir", killed["runs"], "--resume", "--quiet", killed["plan"])
    assert proc.returncode == 0, proc.stderr
    result = json.loads((killed["runs"] / killed["run_id"] / "result.json").read_text())
    assert result["attempt"] == 2 and result["committed_updates"] == UPDATES
    assert result["warnings"] == []
    check = next(c for c in result["checks"] if c["name"] == "resume")
    start = int(check["detail"].rsplit(" ", 1)[1])
    assert start >= 4
    resumed = killed["runs"] / killed["run_id"] / "attempts" / "2"
    steps = [json.loads(x)["step"] for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(start + 1, UPDATES + 1))
    mine, theirs = _final_weights(resumed), _final_weights(uninterrupted)
    assert all(torch.equal(mine[n], theirs[n]) for n in theirs)
