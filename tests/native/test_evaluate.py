"""`evaluate RUN --split test`: a verified checkpoint scored with the spec's validation decoding
through the trainer's own validation path, recorded apart from the training metrics; and the
TensorBoard event files the native engine writes beside metrics.jsonl."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from stateset_backend.cli import main

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(__name__)]


def _tiny_spec(**changes):
    where = importlib.util.spec_from_file_location("native_conftest",
                                                   Path(__file__).with_name("conftest.py"))
    assert where is not None and where.loader is not None
    conftest = importlib.util.module_from_spec(where)
    where.loader.exec_module(conftest)
    return conftest.tiny_spec(**changes)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One real native run: 6 updates, validated and checkpointed every 2."""
    tmp = tmp_path_factory.mktemp("evaluate")
    spec, plan, runs = tmp / "spec.json", tmp / "plan.json", tmp / "runs"
    spec.write_text(json.dumps(_tiny_spec(**{"evaluation.every": 2})))
    assert main(["plan", "--engine", "native", str(spec), "-o", str(plan)]) == 0
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan)]) == 0
    return runs, json.loads(plan.read_text())["run_id"]


def _evaluate(capsys, runs: Path, run_id: str, *extra: str) -> dict:
    capsys.readouterr()
    code = main(["evaluate", run_id, "--runs-dir", str(runs), "--json", *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def _series(runs: Path, run_id: str) -> list[dict]:
    path = runs / run_id / "attempts" / "1" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_recommended_final_and_update_n_are_recorded_apart(finished, capsys):
    runs, run_id = finished
    result = json.loads((runs / run_id / "result.json").read_text())
    before = (runs / run_id / "attempts" / "1" / "metrics.jsonl").read_bytes()
    recommended = result["selection"]["update"]
    for which, update in (("recommended", recommended), ("final", 6), ("update-2", 2)):
        doc = _evaluate(capsys, runs, run_id, "--split", "test", "--checkpoint", which)
        path = Path(doc["path"])
        assert path == runs / run_id / "evaluations" / f"test-attempt1-update-{update:06d}.json"
        record = json.loads(path.read_text())
        assert record["split"] == "test" and record["attempt"] == 1
        assert record["checkpoint"]["requested"] == which
        assert record["checkpoint"]["update"] == update
        assert record["checkpoint"]["path"] == f"checkpoints/update-{update:06d}"
        recorded = {a["path"]: a["sha256"] for a in result["artifacts"]}
        assert record["checkpoint"]["files"] and all(
            recorded[p] == h for p, h in record["checkpoint"]["files"].items())
        assert record["decoding"] == {"temperature": 0.0, "top_p": 1.0, "samples": 1,
                                      "max_response_tokens": 2}
        assert record["experiment_digest"] == result["experiment_digest"]
        assert set(record["metrics"]) == {"test/reward/mean"}
        assert 0.0 <= record["metrics"]["test/reward/mean"] <= 1.0
    # never merged into the training record
    assert (runs / run_id / "attempts" / "1" / "metrics.jsonl").read_bytes() == before
    assert json.loads((runs / run_id / "result.json").read_text()) == result

    capsys.readouterr()
    assert main(["runs", "show", run_id, "--runs-dir", str(runs), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {(e["split"], e["update"]) for e in shown["evaluations"]} >= {
        ("test", recommended), ("test", 6), ("test", 2)}
    assert main(["runs", "compare", run_id, "--runs-dir", str(runs), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["attempts"][0]
    assert {e["update"] for e in row["test"] if e["split"] == "test"} >= {2, 6}
    assert main(["runs", "compare", run_id, "--runs-dir", str(runs)]) == 0
    assert "test@" in capsys.readouterr().out  # the "test metrics" column
    # the report's test table reads the same records
    page = runs.parent / "report.html"
    assert main(["report", run_id, "--runs-dir", str(runs), "-o", str(page)]) == 0
    html = page.read_text()
    assert "test-attempt1-update-000002.json" in html and "test/reward/mean" in html
    assert "No held-out test evaluation" not in html


def test_the_validation_split_reproduces_what_training_logged(finished, capsys):
    """Same checkpoint, same split, same code path: the number training logged at update 6."""
    runs, run_id = finished
    logged = next(r for r in _series(runs, run_id) if r["step"] == 6)["val/reward/mean"]
    doc = _evaluate(capsys, runs, run_id, "--split", "validation", "--checkpoint", "update-6")
    assert doc["metrics"] == {"val/reward/mean": logged}


def test_test_metrics_equal_the_validation_path_on_the_test_split(finished, capsys, tmp_path):
    """The record's number is what Trainer.validate computes for that checkpoint's weights on
    the test rows, with the generator seeded for that update."""
    from stateset_backend.native import checkpoint as ckpt
    from stateset_backend.native.data import load_split
    from stateset_backend.native.trainer import Trainer, load_settings

    runs, run_id = finished
    doc = _evaluate(capsys, runs, run_id, "--split", "test", "--checkpoint", "update-4")
    attempt = runs / run_id / "attempts" / "1"
    trainer = Trainer(load_settings(attempt / "native_config.json"), tmp_path)
    state = ckpt.load(attempt / "checkpoints" / "update-000004",
                      experiment_digest=trainer.settings.experiment_digest, model=trainer.model,
                      optimizer=trainer.optimizer, scheduler=trainer.scheduler,
                      generator=trainer.generator)
    trainer.update_count = state.update
    rows = trainer._fit_prompts(load_split(trainer.spec.data.test, trainer.settings.base_dir),
                                "test")
    assert len(rows) == 200
    expected = trainer.validate(rows)["val/reward/mean"]
    assert doc["metrics"] == {"test/reward/mean": expected}


def test_a_missing_checkpoint_is_exit_6(finished, capsys):
    runs, run_id = finished
    assert main(["evaluate", run_id, "--runs-dir", str(runs), "--split", "test",
                 "--checkpoint", "update-5"]) == 6
    err = capsys.readouterr().err
    assert "has no checkpoint at update 5 (checkpoints at updates: 2, 4, 6)" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["evaluate", run_id, "--runs-dir", str(runs), "--split", "test",
                 "--checkpoint", "best"]) == 2


@pytest.mark.parametrize("damage", ["flip_weights", "drop_manifest_entry"])
def test_a_damaged_checkpoint_is_refused_before_it_loads(finished, capsys, tmp_path, damage):
    runs, run_id = finished
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    shutil.rmtree(copy / run_id / "evaluations", ignore_errors=True)
    folder = copy / run_id / "attempts" / "1" / "checkpoints" / "update-000004"
    if damage == "flip_weights":
        data = bytearray((folder / "weights.safetensors").read_bytes())
        data[-1] ^= 0xFF
        (folder / "weights.safetensors").write_bytes(bytes(data))
        named = "weights.safetensors"
    else:
        (folder / "manifest.json").write_text("{}")
        named = "manifest.json"
    capsys.readouterr()
    assert main(["evaluate", run_id, "--runs-dir", str(copy), "--split", "test",
                 "--checkpoint", "update-4"]) == 6
    err = capsys.readouterr().err
    assert named in err and "does not match" in err
    assert not (copy / run_id / "evaluations" / "test-attempt1-update-000004.json").exists()


def test_an_engine_without_an_evaluator_is_refused_with_exit_3(finished, capsys, tmp_path):
    runs, run_id = finished
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    plan_path = copy / run_id / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan_path.write_text(json.dumps({**plan, "engine": "verl"}))
    capsys.readouterr()
    assert main(["evaluate", run_id, "--runs-dir", str(copy), "--split", "test"]) == 3
    err = capsys.readouterr().err
    assert "engine verl: its adapter does not declare how to evaluate" in err


def test_a_spec_without_a_test_split_is_exit_2(capsys, tmp_path):
    doc = _tiny_spec(**{"budget.total_updates": 2, "evaluation.every": None,
                        "evaluation.select_by": None})
    del doc["data"]["test"]
    spec, plan, runs = tmp_path / "spec.json", tmp_path / "plan.json", tmp_path / "runs"
    spec.write_text(json.dumps(doc))
    assert main(["plan", "--engine", "native", str(spec), "-o", str(plan)]) == 0
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan)]) == 0
    run_id = json.loads(plan.read_text())["run_id"]
    capsys.readouterr()
    assert main(["evaluate", run_id, "--runs-dir", str(runs), "--split", "test",
                 "--checkpoint", "final"]) == 2
    assert "its spec has no data.test split" in capsys.readouterr().err
    # and with no select_by there is nothing recommended: exit 6, saying so
    assert main(["evaluate", run_id, "--runs-dir", str(runs), "--split", "validation"]) == 6
    assert "the spec names no evaluation.select_by" in capsys.readouterr().err


def test_tensorboard_events_mirror_metrics_jsonl_and_are_not_artifacts(finished):
    from stateset_backend.runs.tensorboard import read_scalars

    runs, run_id = finished
    attempt = runs / run_id / "attempts" / "1"
    assert list((attempt / "tensorboard").glob("events.out.tfevents.*"))
    scalars = read_scalars(attempt / "tensorboard")
    rows = _series(runs, run_id)
    assert sorted(scalars) == [r["step"] for r in rows] == list(range(7))
    for row in rows:
        expected = {k: v for k, v in row.items() if k != "step"}
        assert set(scalars[row["step"]]) == set(expected)
        for name, value in expected.items():  # TensorBoard keeps float32
            assert scalars[row["step"]][name] == pytest.approx(value, rel=1e-6, abs=1e-7)
    # the whole store is one log dir: every run shows up under runs/
    assert read_scalars(runs)[6] == scalars[6]
    result = json.loads((attempt / "result.json").read_text())
    assert result["status"] == "succeeded"
    assert not [a for a in result["artifacts"] if "tensorboard" in a["path"]]


def test_verify_on_a_healthy_run_reloads_and_marks_nothing(finished, capsys):
    runs, run_id = finished
    capsys.readouterr()
    assert main(["runs", "verify", run_id, "--runs-dir", str(runs), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["was_quarantined"] is False and doc["quarantine"] is None
    assert doc["verified"]["update"] == 6
    assert doc["verified"]["checkpoint"] == "attempts/1/checkpoints/update-000006"
    assert doc["verified"]["loaded"]["optimizer_states"] > 0
    assert not (runs / run_id / "quarantine.json").exists()


def test_a_conversation_run_is_evaluated_through_its_environment(capsys, tmp_path):
    """Multi-turn: the environment's workers serve the held-out split, and the validation
    split reproduces what training logged, failed-conversation share included."""
    from native.agent_support import agent_spec

    doc = agent_spec(**{"algorithm": {"objective": "grpo", "group_size": 4},
                        "budget.total_updates": 3, "budget.prompts_per_update": 4,
                        "evaluation": {"every": 3, "select_by": "val/reward/mean"},
                        "checkpoint": {"every": 3, "keep": 1}})
    spec, plan, runs = tmp_path / "spec.json", tmp_path / "plan.json", tmp_path / "runs"
    spec.write_text(json.dumps(doc))
    assert main(["plan", "--engine", "native", str(spec), "-o", str(plan)]) == 0
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan)]) == 0
    run_id = json.loads(plan.read_text())["run_id"]
    logged = next(r for r in _series(runs, run_id) if r["step"] == 3)
    validation = _evaluate(capsys, runs, run_id, "--split", "validation")
    assert validation["checkpoint"]["update"] == 3
    assert validation["metrics"] == {k: v for k, v in logged.items() if k.startswith("val/")}
    test = _evaluate(capsys, runs, run_id, "--split", "test", "--checkpoint", "final")
    assert set(test["metrics"]) == {"test/reward/mean", "test/conversations/failed_share"}
