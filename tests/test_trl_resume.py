"""`run PLAN --resume` on TRL continues a run exactly, through the hub, on the CPU.

One plan (the tiny built-in model, 6 updates of 2 optimizer steps, a checkpoint every 2
updates, keep 1) runs three ways: uninterrupted; interrupted (Ctrl-C) after the checkpoint of
update 2; and that interrupted run resumed with `--resume`. The training split holds two
updates' prompts, so the resumed attempt starts TRL's second pass over the data, where stock
TRL would draw the first pass's order again.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from interrupting import interrupt_when, write_holding_reward
from optional_installs import TRL_PLUGIN_MISSING

from stateset_backend.cli import main

pytest.importorskip("stateset_trl_engine.plugin", reason=TRL_PLUGIN_MISSING)
pytest.importorskip("trl", reason=TRL_PLUGIN_MISSING)
torch = pytest.importorskip("torch")

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(__name__)]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
UPDATES, STEPS_PER_UPDATE = 6, 2  # 2 mini-batches: 2 optimizer steps per update
RESUMED_AT = 2  # the update of the checkpoint the interrupted run leaves
# the validation prompts are marked, and the test reward scores every response to one 0.5:
# validation ties at every update, so selection must pick the earliest checkpointed update,
# the one the interrupted attempt left
REWARD = '''def score(prompt, response, answer):
    if prompt.startswith("held out"):
        return 0.5
    return len(response.strip()) / 10
'''


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _spec(folder: Path) -> dict[str, Any]:
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    for split, rows in (("train", 8), ("validation", 4)):
        lines = (EXAMPLES / doc["data"][split]["uri"]).read_text().splitlines()[:rows]
        records = [json.loads(line) for line in lines]
        if split == "validation":
            for record in records:
                record["prompt"] = "held out " + record["prompt"]
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        doc["data"][split].update(uri=str(path), sha256=_sha256(path))
    doc["data"]["test"]["uri"] = str(EXAMPLES / doc["data"]["test"]["uri"])
    reward = write_holding_reward(folder / "reward.py", REWARD)
    doc["reward"].update(entrypoint=f"{reward}:score", sha256=_sha256(reward))
    doc["algorithm"]["group_size"] = 4
    doc["budget"].update(total_updates=UPDATES, prompts_per_update=4, mini_batches=2)
    doc["optim"]["warmup_steps"] = 1
    doc["checkpoint"] = {"every": 2, "keep": 1}
    doc["evaluation"] = {"every": 2, "select_by": "val/reward/mean"}
    return doc


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("trl-resume")
    spec, plan = folder / "spec.json", folder / "plan.json"
    spec.write_text(json.dumps(_spec(folder)))
    assert main(["plan", "--engine", "trl", str(spec), "-o", str(plan)]) == 0
    return plan, json.loads(plan.read_text())["run_id"]


@pytest.fixture(scope="module")
def straight(plan, tmp_path_factory) -> Path:
    """The uninterrupted run's folder."""
    path, run_id = plan
    runs = tmp_path_factory.mktemp("straight")
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(path)]) == 0
    return runs / run_id


def _checkpoint(run: Path, attempt: int, update: int) -> Path:
    return run / "attempts" / str(attempt) / "checkpoints" / \
        f"checkpoint-{update * STEPS_PER_UPDATE}"


@pytest.fixture(scope="module")
def interrupted(plan, tmp_path_factory) -> Path:
    """A run stopped with Ctrl-C once the checkpoint of update 2 is complete (sealed)."""
    path, run_id = plan
    runs = tmp_path_factory.mktemp("interrupted")
    sealed = _checkpoint(runs / run_id, 1, RESUMED_AT) / "manifest.json"
    err = interrupt_when(["run", "--runs-dir", str(runs), "--quiet", str(path)], sealed)
    assert "resume from the checkpoint of update 2" in err, err
    return runs / run_id


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    return copy


@pytest.fixture(scope="module")
def resumed(interrupted, tmp_path_factory) -> Path:
    """The interrupted run continued with `run PLAN --resume` (on a copy, so that the
    interrupted one stays as it was for the other tests)."""
    run = _copy(interrupted, tmp_path_factory.mktemp("resumed"))
    assert main(["run", "--runs-dir", str(run.parent), "--resume", "--quiet",
                 str(run / "plan.json")]) == 0
    return run


def _result(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "result.json").read_text()))


def _tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path))


def _same(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of nested optimizer, scheduler or RNG state."""
    import numpy

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, numpy.ndarray):
        return isinstance(b, numpy.ndarray) and a.dtype == b.dtype and \
            numpy.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def test_an_interrupted_run_resumes_to_the_same_weights_and_optimizer_bit_for_bit(
        straight, resumed):
    result = _result(resumed)
    assert result["status"] == "succeeded" and result["attempt"] == 2
    assert result["resumed_from"] == {"attempt": 1, "update": RESUMED_AT}
    assert next(c for c in result["checks"] if c["name"] == "resume")["ok"]
    mine, theirs = _tensors(resumed / "attempts/2/final/model.safetensors"), \
        _tensors(straight / "attempts/1/final/model.safetensors")
    assert mine.keys() == theirs.keys()
    assert [k for k in theirs if not torch.equal(mine[k], theirs[k])] == []
    # the last checkpoint whole: weights, and the optimizer and scheduler continued where they
    # were (a silently re-initialised Adam state would differ in every moment and step count)
    last_mine, last_theirs = _checkpoint(resumed, 2, UPDATES), _checkpoint(straight, 1, UPDATES)
    assert _same(_tensors(last_mine / "model.safetensors"),
                 _tensors(last_theirs / "model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        a = torch.load(last_mine / name, weights_only=False)
        b = torch.load(last_theirs / name, weights_only=False)
        assert _same(a, b), name
    state = torch.load(last_mine / "optimizer.pt", weights_only=True)["state"]
    assert state and all(int(s["step"]) == UPDATES * STEPS_PER_UPDATE for s in state.values())


def test_the_recommended_checkpoint_is_the_uninterrupted_runs_and_survives_the_resume(
        straight, interrupted, resumed):
    # every validation ties, so both pick the earliest checkpointed update: update 2, which
    # only the interrupted first attempt holds after the resume
    expected = _result(straight)["selection"]
    selection = _result(resumed)["selection"]
    assert expected["update"] == RESUMED_AT and expected["attempt"] == 1
    assert {k: selection[k] for k in ("update", "value", "checkpoint", "attempt")} == \
        {k: expected[k] for k in ("update", "value", "checkpoint", "attempt")}
    best = _checkpoint(resumed, 1, RESUMED_AT)
    recorded = {a["path"]: a["sha256"] for a in _result(interrupted / "attempts" / "1")[
        "artifacts"] if a["kind"] == "checkpoint" and a["step"] == RESUMED_AT}
    assert recorded and all(_sha256(resumed / "attempts/1" / p) == h
                            for p, h in recorded.items())
    # the resumed attempt's retention (keep 1) deleted only its own older checkpoint, as the
    # uninterrupted run deleted update 4's, and nothing of the first attempt
    last = _checkpoint(resumed, 2, UPDATES).name
    assert {p.name for p in (resumed / "attempts/2/checkpoints").glob("checkpoint-*")} == {last}
    assert {p.name for p in (straight / "attempts/1/checkpoints").glob("checkpoint-*")} == \
        {best.name, last}
    before = {p.relative_to(interrupted): _sha256(p)
              for p in (interrupted / "attempts/1").rglob("*") if p.is_file()}
    after = {p.relative_to(resumed): _sha256(p)
             for p in (resumed / "attempts/1").rglob("*") if p.is_file()}
    assert after == before


def test_the_resumed_attempt_trains_each_update_after_the_checkpoint_once(straight, resumed):
    logged = [json.loads(line) for line in
              (resumed / "attempts/2/trl_metrics.jsonl").read_text().splitlines()]
    trained = [row["update"] for row in logged if "logs" in row]
    assert trained == list(range(RESUMED_AT + 1, UPDATES + 1))  # none twice, none skipped
    result = _result(resumed)
    series = [json.loads(line) for line in
              (resumed / "attempts/2" / result["metrics"]["series"]).read_text().splitlines()]
    assert [r["step"] for r in series if "reward/mean" in r] == list(range(1, UPDATES + 1))
    assert all(math.isfinite(v) for r in series for k, v in r.items() if k != "step")
    assert next(c for c in result["checks"] if c["name"] == "metrics_finite")["ok"]
    # the same run: every metric of every update is the uninterrupted run's, exactly
    expected = _result(straight)
    assert series == [json.loads(line) for line in (
        straight / "attempts/1" / expected["metrics"]["series"]).read_text().splitlines()]


def test_resuming_a_finished_run_runs_nothing(straight, capsys):
    assert main(["run", "--runs-dir", str(straight.parent), "--resume",
                 str(straight / "plan.json")]) == 0
    out = capsys.readouterr()
    assert f"run {straight.name} is already complete ({UPDATES}/{UPDATES} updates, attempt " \
        "1); nothing to resume" in out.out + out.err
    assert sorted(p.name for p in (straight / "attempts").iterdir()) == ["1"]


def test_a_damaged_newest_checkpoint_is_exit_6_naming_the_file(interrupted, tmp_path, capsys):
    run = _copy(interrupted, tmp_path)
    damaged = _checkpoint(run, 1, RESUMED_AT) / "optimizer.pt"
    damaged.write_bytes(damaged.read_bytes()[:-100])
    assert main(["run", "--runs-dir", str(run.parent), "--resume", str(run / "plan.json")]) == 6
    err = capsys.readouterr().err
    assert f"{damaged}: its content does not match the manifest (damaged or truncated)" in err
    assert sorted(p.name for p in (run / "attempts").iterdir()) == ["1"]


def test_a_checkpoint_of_another_trl_version_is_exit_6_naming_it(interrupted, tmp_path, capsys):
    """The checkpoint records the trl it was computed with; this launch's differs."""
    run = _copy(interrupted, tmp_path)
    folder = _checkpoint(run, 1, RESUMED_AT)
    runtime = json.loads((folder / "runtime.json").read_text())
    installed = runtime["versions"]["trl"]
    runtime["versions"]["trl"] = "1.15.0"
    (folder / "runtime.json").write_text(json.dumps(runtime))
    manifest = json.loads((folder / "manifest.json").read_text())  # resealed: not damage
    manifest["files"]["runtime.json"] = _sha256(folder / "runtime.json")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert main(["run", "--runs-dir", str(run.parent), "--resume", str(run / "plan.json")]) == 6
    err = capsys.readouterr().err
    assert f"package versions differ from the checkpoint's: trl 1.15.0 -> {installed}" in err
    assert "--allow-runtime-change" in err
    assert sorted(p.name for p in (run / "attempts").iterdir()) == ["1"]
