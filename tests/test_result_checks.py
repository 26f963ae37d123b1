"""A result is succeeded only when every check holds: metrics are finite numbers (never a
string such as "NaN"), and no artifact is reached through a link leaving the attempt."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stateset_backend.adapters.native.adapter import NativeAdapter
from stateset_backend.conformance.specs import MINIMAL
from stateset_backend.engines.adapter import Artifact, Collected
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.providers.local import Exit
from stateset_backend.runs.results import evaluate
from stateset_backend.spec.files import parse_spec


@pytest.fixture(scope="module")
def plan():
    entry = AdapterEntry(NativeAdapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(parse_spec(MINIMAL), entry, "0.1.0")


def _collected(plan, tmp_path: Path, metrics=None, artifacts=None) -> Collected:
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    (tmp_path / "ckpt" / "weights.bin").write_bytes(b"w")
    return Collected(run_id=plan.run_id, experiment_digest=plan.experiment_digest,
                     committed_updates=3,
                     metrics=metrics if metrics is not None else
                     [{"step": 1, "reward/mean": 0.5}],
                     artifacts=artifacts if artifacts is not None else
                     [Artifact("ckpt/weights.bin", "checkpoint", 3)])


def _checks(plan, tmp_path, collected):
    status, checks, records = evaluate(plan, Exit(code=0), collected, tmp_path)
    return status, {c.name: c for c in checks}, records


def test_a_healthy_attempt_succeeds(plan, tmp_path):
    status, _, records = _checks(plan, tmp_path, _collected(plan, tmp_path))
    assert status == "succeeded" and records[0].path == "ckpt/weights.bin"


@pytest.mark.parametrize("value", ["NaN", "0.5", float("nan"), float("inf"), None, True, 1e300])
def test_a_metric_that_is_not_a_finite_number_is_invalid(plan, tmp_path, value):
    collected = _collected(plan, tmp_path, metrics=[{"step": 1, "loss/policy": value}])
    status, checks, _ = _checks(plan, tmp_path, collected)
    assert status == "invalid" and not checks["metrics_finite"].ok
    assert "loss/policy" in checks["metrics_finite"].detail


def test_a_symlink_leaving_the_attempt_is_refused_and_never_hashed(plan, tmp_path):
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"not ours")
    collected = _collected(plan, attempt)
    os.symlink(outside, attempt / "ckpt" / "planted.bin")
    collected.artifacts.append(Artifact("ckpt/planted.bin", "checkpoint", 3))
    status, checks, records = _checks(plan, attempt, collected)
    assert status == "invalid" and "ckpt/planted.bin" in checks["artifacts"].detail
    assert "symbolic link" in checks["artifacts"].detail
    assert all(r.path != "ckpt/planted.bin" for r in records)


def test_a_symlinked_folder_is_refused(plan, tmp_path):
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "w.bin").write_bytes(b"x")
    collected = _collected(plan, attempt)
    os.symlink(tmp_path / "elsewhere", attempt / "linked")
    collected.artifacts.append(Artifact("linked/w.bin", "checkpoint", 3))
    status, checks, _ = _checks(plan, attempt, collected)
    assert status == "invalid" and "linked is a symbolic link" in checks["artifacts"].detail


def test_a_path_climbing_out_is_refused(plan, tmp_path):
    collected = _collected(plan, tmp_path)
    collected.artifacts.append(Artifact("../escape.bin", "checkpoint", 3))
    status, checks, _ = _checks(plan, tmp_path, collected)
    assert status == "invalid" and "outside the attempt" in checks["artifacts"].detail


def test_a_failed_engine_is_reported_with_its_own_last_error_line(plan, tmp_path):
    (tmp_path / "stderr.log").write_text(
        "loading\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
        "RuntimeError: CUDA out of memory\n[rank0]: done, no errors left\n"
        "Exception ignored in: <function Pool.__del__>\n")
    status, checks, _ = evaluate(plan, Exit(code=1), _collected(plan, tmp_path), tmp_path)
    assert status == "failed"
    assert {c.name: c for c in checks}["exit_code"].detail == \
        "engine exited 1: RuntimeError: CUDA out of memory"


def test_a_resume_with_no_update_left_needs_no_new_metrics(plan, tmp_path):
    planned = plan.validated_spec().budget.total_updates
    collected = _collected(plan, tmp_path, metrics=[])
    collected = Collected(**{**collected.__dict__, "committed_updates": planned,
                             "resumed_from": planned})
    status, checks, _ = evaluate(plan, Exit(code=0), collected, tmp_path,
                                 resumed_from=planned)
    assert status == "succeeded", checks
    # anywhere else, an attempt without metrics is invalid
    status, checks, _ = _checks(plan, tmp_path, _collected(plan, tmp_path, metrics=[]))
    assert status == "invalid" and checks["metrics_finite"].detail == "no metrics were reported"


def test_an_engine_that_stops_before_the_budget_and_exits_0_is_invalid(plan, tmp_path):
    """A failure users of the engines report (verl's among them): a resume that trains
    nothing (or any run that ends its loop early) and exits 0 is not the experiment that was
    asked for."""
    planned = plan.validated_spec().budget.total_updates
    early = Collected(**{**_collected(plan, tmp_path).__dict__,
                         "committed_updates": planned - 1})
    status, checks, _ = _checks(plan, tmp_path, early)
    assert status == "invalid"
    assert checks["committed_updates"].detail == \
        f"{planned - 1} of {planned} planned updates committed; the engine stopped before " \
        "the budget was spent"
    # resumed from update 1, the engine reports the checkpoint's update and nothing more
    idle = Collected(**{**early.__dict__, "committed_updates": 1, "resumed_from": 1})
    status, checks, _ = evaluate(plan, Exit(code=0), idle, tmp_path, resumed_from=1)
    assert status == "invalid" and not checks[[c.name for c in checks].index(
        "committed_updates")].ok


def test_a_weights_file_is_judged_by_what_its_format_proves(tmp_path):
    """Empty and cut-short safetensors or torch files are not whole; a file in a format the hub
    cannot read (or too short to be a header at all) is not called broken."""
    import torch
    from safetensors.torch import save_file

    from stateset_backend.runs.weights_files import problem

    whole = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(64)}, str(whole))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(whole.read_bytes()[:-10])
    into_header = tmp_path / "header.safetensors"
    into_header.write_bytes(whole.read_bytes()[:20])
    saved = tmp_path / "state.pt"
    torch.save({"w": torch.zeros(64)}, saved)
    cut_zip = tmp_path / "cut.pt"
    cut_zip.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    for path in (whole, saved, tmp_path / "junk.safetensors", tmp_path / "raw.bin",
                 tmp_path / "notes.txt"):
        if not path.exists():
            path.write_bytes(b"weights" if path.suffix != ".txt" else b"")
        assert problem(path) is None, path
    assert problem(empty) == "empty (0 bytes)"
    assert problem(cut).startswith("cut short: its header declares")
    assert problem(into_header).startswith("cut short: its header alone needs")
    at_length = tmp_path / "length.safetensors"
    at_length.write_bytes(whole.read_bytes()[:8])
    assert problem(at_length).startswith("cut short: its header alone needs")
    not_a_zip = tmp_path / "tensor.bin"
    not_a_zip.write_bytes(b"PK" + bytes(62))  # a raw fp16 dump that starts like one
    assert problem(not_a_zip) is None
    assert problem(cut_zip).startswith("cut short: a torch.save zip archive")


def test_an_engine_that_ran_other_execution_options_is_invalid(plan, tmp_path):
    """An execution option is outside the experiment's identity but part of the launch that
    was reviewed: an engine reporting it ran other kernels than the plan's has not run it."""
    assert plan.native["sampling.kernels"] == "exact"
    collected = _collected(plan, tmp_path)
    collected.execution = {"sampling.kernels": "exact"}
    status, checks, _ = _checks(plan, tmp_path, collected)
    assert status == "succeeded" and checks["execution"].ok
    collected.execution = {"sampling.kernels": "fast"}
    status, checks, _ = _checks(plan, tmp_path, collected)
    assert status == "invalid" and not checks["execution"].ok
    assert checks["execution"].detail == \
        "ran with sampling.kernels='fast', the plan says 'exact'"
    # an option the plan does not name is the engine's default, which the plan left to it
    # (a plan made before the engine had the option): not a difference
    collected.execution = {"sampling.kernels": "exact", "sampling.threads": 4}
    status, checks, _ = _checks(plan, tmp_path, collected)
    assert status == "succeeded" and checks["execution"].ok


def test_an_engine_that_reports_no_execution_options_is_not_judged_on_them(plan, tmp_path):
    _, checks, _ = _checks(plan, tmp_path, _collected(plan, tmp_path))
    assert "execution" not in checks


def test_a_collector_that_raises_or_returns_another_type_is_the_attempts_finding(tmp_path):
    """Whatever ``collect`` does, the attempt gets a result naming it: the exception it
    raised, or the type it returned in place of a Collected (never an AttributeError of ours
    further on), and a rehearsal's unread lines say why they could not be read."""
    from stateset_backend.engines.adapter import LaunchContext, collect_outputs
    from stateset_backend.runs.rehearsal.verdict import _from_check
    from stateset_backend.runs.results import Check, Result

    class Returns(NativeAdapter):
        def __init__(self, value):
            self.value = value

        def collect(self, attempt_dir, ctx):
            if isinstance(self.value, Exception):
                raise self.value
            return self.value

    ctx = LaunchContext("run", "sha256:" + "0" * 64, "0.1.0", None)
    assert collect_outputs(Returns({"run_id": "run"}), tmp_path, ctx) == \
        (None, "the native adapter's collect returned a dict, not a Collected")
    assert collect_outputs(Returns(KeyError("val/score")), tmp_path, ctx) == \
        (None, "KeyError: 'val/score'")
    found = Collected(run_id="run")
    assert collect_outputs(Returns(found), tmp_path, ctx) == (found, None)
    result = Result.model_construct(checks=[Check(name="collect", ok=False,
                                                  detail="KeyError: 'val/score'")])
    line = _from_check(result, "identity", "identity")
    assert line.state == "FAILED" and "KeyError: 'val/score'" in line.detail
