"""Quarantine: a learner update that fails part-way, a checkpoint write that fails and a restore
that fails each mark the run; `run --resume` and `evaluate` refuse it (exit 6) until
`runs verify` reloads a verified checkpoint whole. Every fault is a real one in a real CPU
run: a learning rate that turns the second mini-batch's loss into NaN after the first one
stepped, a file-size limit the checkpoint's weights cannot fit under, and damaged checkpoint
files on resume."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stateset_backend.cli import main

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(__name__)]


def _conftest():
    where = importlib.util.spec_from_file_location("native_conftest",
                                                   Path(__file__).with_name("conftest.py"))
    assert where is not None and where.loader is not None
    conftest = importlib.util.module_from_spec(where)
    where.loader.exec_module(conftest)
    return conftest


def _tiny_spec(**changes):
    return _conftest().tiny_spec(**changes)


def _plan(tmp: Path, doc: dict) -> tuple[Path, str]:
    spec, plan = tmp / "spec.json", tmp / "plan.json"
    spec.write_text(json.dumps(doc))
    assert main(["plan", "--engine", "native", str(spec), "-o", str(plan)]) == 0
    return plan, json.loads(plan.read_text())["run_id"]


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _assert_gated(capsys, runs: Path, run_id: str, plan: Path, fault: str) -> None:
    """While marked: resume and evaluate are exit 6 naming the quarantine; show and list
    display it."""
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 6 and f"run {run_id} is quarantined ({fault}" in err, err
    assert "runs verify" in err and len(err.strip().splitlines()) == 1
    code, _, err = _cli(capsys, "evaluate", run_id, "--runs-dir", runs, "--split", "test",
                        "--checkpoint", "update-2")
    assert code == 6 and "is quarantined" in err, err
    code, out, _ = _cli(capsys, "runs", "show", run_id, "--runs-dir", runs, "--json")
    shown = json.loads(out)
    assert shown["quarantine"]["quarantined"] is True
    assert shown["quarantine"]["fault"] == fault.replace(" ", "_")
    code, out, _ = _cli(capsys, "runs", "show", run_id, "--runs-dir", runs)
    assert "QUARANTINED" in out


def test_a_learner_update_that_fails_part_way(capsys, tmp_path):
    # warm-up runs update 1 at lr 0 (checkpointed), update 2 at 5e9: its first mini-batch
    # steps, the second's loss is NaN, so the weights are neither update 1's nor update 2's
    doc = _tiny_spec(**{"optim.lr": 1e10, "budget.total_updates": 4,
                        "checkpoint.every": 1, "evaluation.every": None,
                        "evaluation.select_by": None})
    doc["reward"] = _conftest().signal_reward(tmp_path)  # so update 2's first step moves
    plan, run_id = _plan(tmp_path, doc)
    runs = tmp_path / "runs"
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--quiet", plan)
    assert code == 4, err
    assert "quarantined" in err
    result = json.loads((runs / run_id / "result.json").read_text())
    assert result["status"] == "quarantined"
    check = next(c for c in result["checks"] if c["name"] == "quarantine")
    assert not check["ok"]
    assert check["detail"].startswith("learner update failed at update 2")
    assert "NonFiniteUpdate" in check["detail"]
    assert "after 1 optimizer step(s) of update 2 had started" in check["detail"]
    marker = json.loads((runs / run_id / "quarantine.json").read_text())
    assert marker["quarantined"] and marker["attempt"] == 1 and marker["update"] == 2
    code, out, _ = _cli(capsys, "runs", "list", "--runs-dir", runs, "--status", "quarantined",
                        "--json")
    assert [r["run_id"] for r in json.loads(out)["runs"]] == [run_id]
    _assert_gated(capsys, runs, run_id, plan, "learner update")

    code, out, err = _cli(capsys, "runs", "verify", run_id, "--runs-dir", runs, "--json")
    assert code == 0, err
    verified = json.loads(out)
    assert verified["was_quarantined"] and verified["verified"]["update"] == 1
    assert verified["verified"]["loaded"]["parameters"] > 0
    marker = json.loads((runs / run_id / "quarantine.json").read_text())
    assert marker["quarantined"] is False and marker["cleared_by"]["update"] == 1
    code, out, _ = _cli(capsys, "runs", "show", run_id, "--runs-dir", runs)
    assert "quarantine cleared" in out
    code, out, _ = _cli(capsys, "runs", "list", "--runs-dir", runs, "--json")
    (row,) = json.loads(out)["runs"]  # verified: the attempt failed; its state is sound
    assert (row["status"], row["attempt_status"]) == ("failed", "quarantined")
    # the gate is open: resume launches from update 1 (and, being exact, meets the same NaN)
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 4 and "is quarantined" not in err, err
    second = json.loads((runs / run_id / "attempts" / "2" / "result.json").read_text())
    assert second["status"] == "quarantined"
    assert next(c for c in second["checks"] if c["name"] == "resume")["ok"]


def test_a_learner_failure_before_any_step_is_a_plain_failure(capsys, tmp_path):
    """Nothing moved: the run failed, and resuming it is safe."""
    doc = _tiny_spec(**{"optim.lr": 1e30, "optim.warmup_steps": 0, "budget.total_updates": 2,
                        "budget.mini_batches": 1, "budget.ppo_epochs": 1,
                        "evaluation.every": None, "evaluation.select_by": None})
    doc["reward"] = _conftest().signal_reward(tmp_path)  # so update 1's step moves
    plan, run_id = _plan(tmp_path, doc)
    runs = tmp_path / "runs"
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--quiet", plan)
    result = json.loads((runs / run_id / "result.json").read_text())
    # update 1 (one step) blew the weights up; update 2's only mini-batch is NaN before its step
    assert code == 4 and result["status"] == "failed" and result["committed_updates"] == 1, err
    stderr = (runs / run_id / "attempts" / "1" / "stderr.log").read_text()
    assert "NonFiniteUpdate" in stderr and "the step was not applied" in stderr
    assert not (runs / run_id / "quarantine.json").exists()


def test_a_checkpoint_write_that_fails(capsys, tmp_path):
    """The engine may not write a file larger than 200 kB: the policy weights (370 kB) of the
    first checkpoint hit the limit, as on a full disk."""
    plan, run_id = _plan(tmp_path, _tiny_spec(**{"evaluation.every": None,
                                                 "evaluation.select_by": None}))
    runs = tmp_path / "runs"

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))

    proc = subprocess.run([sys.executable, "-m", "stateset_backend", "run", "--runs-dir",
                           str(runs), "--quiet", str(plan)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"},
                          preexec_fn=limit_file_size, timeout=300)
    assert proc.returncode == 4, proc.stderr
    result = json.loads((runs / run_id / "result.json").read_text())
    # update 2 trained, but its checkpoint failed before it was committed
    assert result["status"] == "quarantined" and result["committed_updates"] == 1
    detail = next(c for c in result["checks"] if c["name"] == "quarantine")["detail"]
    assert detail.startswith("checkpoint write failed at update 2"), detail
    assert "File too large" in detail or "27" in detail, detail
    ckpts = runs / run_id / "attempts" / "1" / "checkpoints"
    assert not [p for p in ckpts.iterdir()]  # the failed write left nothing half-written
    _assert_gated(capsys, runs, run_id, plan, "checkpoint write")
    # nothing verified can be reloaded: the mark stays
    code, _, err = _cli(capsys, "runs", "verify", run_id, "--runs-dir", runs)
    assert code == 6 and "has no complete checkpoint to reload (the run stays quarantined)" \
        in err, err
    assert json.loads((runs / run_id / "quarantine.json").read_text())["quarantined"]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A real 6-update run (checkpoints at 2, 4, 6) whose result reads as interrupted, so
    `run --resume` would continue it."""
    tmp = tmp_path_factory.mktemp("quarantine")
    plan, run_id = _plan(tmp, _tiny_spec(**{"evaluation.every": None,
                                            "evaluation.select_by": None}))
    runs = tmp / "runs"
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan)]) == 0
    for path in (runs / run_id / "result.json",
                 runs / run_id / "attempts" / "1" / "result.json"):
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, "status": "interrupted"}))
    return plan, runs, run_id


def _copy(interrupted, tmp_path: Path) -> tuple[Path, Path, str, Path]:
    plan, runs, run_id = interrupted
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    newest = copy / run_id / "attempts" / "1" / "checkpoints" / "update-000006"
    return plan, copy, run_id, newest


def test_a_damaged_checkpoint_on_resume(interrupted, capsys, tmp_path):
    plan, runs, run_id, newest = _copy(interrupted, tmp_path)
    weights = newest / "weights.safetensors"
    original = weights.read_bytes()
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0x01
    weights.write_bytes(bytes(damaged))

    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 6 and "weights.safetensors: its content does not match" in err, err
    marker = json.loads((runs / run_id / "quarantine.json").read_text())
    assert marker["fault"] == "restore" and marker["update"] == 6
    _assert_gated(capsys, runs, run_id, plan, "restore")
    # verify passes over the damaged newest, naming it, and proves the one before it
    code, out, err = _cli(capsys, "runs", "verify", run_id, "--runs-dir", runs, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["verified"]["update"] == 4 and doc["was_quarantined"]
    (passed,) = doc["verified"]["skipped"]
    assert passed["checkpoint"] == "attempts/1/checkpoints/update-000006"
    assert "weights.safetensors: its content does not match" in passed["problem"]
    assert not json.loads((runs / run_id / "quarantine.json").read_text())["quarantined"]
    # the resume continues from what verify proved, not from the damaged newest
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 0, err
    result = json.loads((runs / run_id / "result.json").read_text())
    assert result["resumed_from"] == {"attempt": 1, "update": 4}
    assert result["committed_updates"] == 6 and result["status"] == "succeeded"
    weights.write_bytes(original)  # the damaged one was left as evidence, never deleted


def test_verify_with_every_checkpoint_damaged_keeps_the_mark_naming_each(interrupted, capsys,
                                                                         tmp_path):
    plan, runs, run_id, newest = _copy(interrupted, tmp_path)
    for folder in newest.parent.iterdir():
        (folder / "rng.pt").unlink()
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 6 and "runs verify" in err
    code, _, err = _cli(capsys, "runs", "verify", run_id, "--runs-dir", runs)
    assert code == 6 and "no checkpoint verifies" in err and "stays quarantined" in err, err
    for update in (2, 4, 6):
        assert f"update-{update:06d}/rng.pt: missing" in err, err
    assert json.loads((runs / run_id / "quarantine.json").read_text())["quarantined"]


def test_a_restore_that_fails_inside_the_engine(interrupted, capsys, tmp_path):
    """Hashes that match a manifest rewritten to fit, over weights the model does not have:
    the engine's restore refuses them, and the attempt is quarantined."""
    from safetensors.torch import load_file, save_file

    from stateset_backend.spec.content import sha256_file

    plan, runs, run_id, newest = _copy(interrupted, tmp_path)
    weights = load_file(str(newest / "weights.safetensors"))
    first = sorted(weights)[0]
    weights[first + ".renamed"] = weights.pop(first)
    save_file(weights, str(newest / "weights.safetensors"))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["files"]["weights.safetensors"] = sha256_file(newest / "weights.safetensors")
    (newest / "manifest.json").write_text(json.dumps(manifest))

    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 4, err
    result = json.loads((runs / run_id / "attempts" / "2" / "result.json").read_text())
    assert result["status"] == "quarantined"
    detail = next(c for c in result["checks"] if c["name"] == "quarantine")["detail"]
    assert detail.startswith("restore failed") and "weights do not match" in detail, detail
    _assert_gated(capsys, runs, run_id, plan, "restore")
    # the manifest holds, the load does not: verify passes over it and proves update 4
    code, out, err = _cli(capsys, "runs", "verify", run_id, "--runs-dir", runs, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["verified"]["update"] == 4
    assert [s["update"] for s in doc["verified"]["skipped"]] == [6]
    assert "does not reload" in doc["verified"]["skipped"][0]["problem"]
    # its manifest still checks, yet the resume continues from what verify proved
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 0, err
    result = json.loads((runs / run_id / "result.json").read_text())
    assert result["resumed_from"] == {"attempt": 1, "update": 4}


def test_a_verification_record_naming_another_folder_is_not_followed(interrupted, capsys,
                                                                     tmp_path):
    plan, runs, run_id, newest = _copy(interrupted, tmp_path)
    (newest / "rng.pt").unlink()
    code, _, _ = _cli(capsys, "runs", "verify", run_id, "--runs-dir", runs)
    assert code == 0
    record = runs / run_id / "verified.json"
    doc = json.loads(record.read_text())
    assert doc["checkpoint"] == "attempts/1/checkpoints/update-000004"
    outside = tmp_path / "elsewhere"
    shutil.copytree(newest.parent / "update-000004", outside)
    record.write_text(json.dumps({**doc, "checkpoint": f"../../{outside.relative_to(tmp_path)}"}))
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 6 and "cannot be resumed" in err and "rng.pt: missing" in err, err
    # a verified folder rewritten since is not followed either
    code, _, _ = _cli(capsys, "runs", "verify", run_id, "--runs-dir", runs)
    assert code == 0 and not json.loads((runs / run_id / "quarantine.json").read_text())[
        "quarantined"]
    record.write_text(json.dumps({**doc, "manifest_sha256": "0" * 64}))
    code, _, err = _cli(capsys, "run", "--runs-dir", runs, "--resume", "--quiet", plan)
    assert code == 6 and "cannot be resumed" in err and "rng.pt: missing" in err, err
