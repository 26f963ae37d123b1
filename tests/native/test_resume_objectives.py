"""`run --resume` continues PPO (policy and critic) and SFT runs exactly, through the CLI:
the resumed run's last checkpoint equals the uninterrupted run's, file by file; and a resume
under another runtime identity is refused with exit 6 naming the difference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stateset_backend.cli import main
from stateset_backend.native import checkpoint

from .conftest import tiny_spec

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(__name__)]


def _ppo(tiny):
    doc = tiny()
    doc["algorithm"] = {"objective": "ppo",
                        "gae": {"critic": {"model": "separate", "lr": 1e-3,
                                           "warmup_updates": 1}}}
    return doc


def _sft(tiny):
    doc = tiny()
    doc["algorithm"] = {"objective": "sft", "sft": {"layout": "packed"}}
    doc["budget"] = {"total_updates": 6, "prompts_per_update": 8}
    doc["evaluation"] = {"every": 2, "select_by": "val/loss"}
    return doc


@pytest.fixture(scope="module", params=["ppo", "sft"])
def finished(request, tmp_path_factory):
    """One uninterrupted run (6 updates, checkpoints every 2), shared by the tests below: each
    resumes a copy of it."""
    doc = _ppo(tiny_spec) if request.param == "ppo" else _sft(tiny_spec)
    tmp = tmp_path_factory.mktemp(request.param)
    spec, plan, runs = tmp / "spec.json", tmp / "plan.json", tmp / "runs"
    spec.write_text(json.dumps(doc))
    assert main(["plan", "--engine", "native", str(spec), "-o", str(plan)]) == 0
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan)]) == 0
    return request.param, plan, runs, json.loads(plan.read_text())["run_id"]


def _interrupted_after_update_2(finished, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the run as an interruption after the checkpoint of update 2 leaves it."""
    _, plan, runs, run_id = finished
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    first = copy / run_id / "attempts" / "1"
    for later in ("update-000004", "update-000006"):
        shutil.rmtree(first / "checkpoints" / later)
    shutil.rmtree(first / "final")
    doc = json.loads((first / "result.json").read_text())
    doc.update(status="interrupted", committed_updates=2,
               artifacts=[a for a in doc["artifacts"] if a["step"] in (1, 2)])
    for path in (first / "result.json", copy / run_id / "result.json"):
        path.write_text(json.dumps(doc))
    return plan, copy, runs / run_id / "attempts" / "1" / "checkpoints" / "update-000006"


def test_resume_continues_exactly(finished, tmp_path):
    kind, _, _, run_id = finished
    plan, runs, straight = _interrupted_after_update_2(finished, tmp_path)
    assert main(["run", "--runs-dir", str(runs), "--resume", "--quiet", str(plan)]) == 0
    result = json.loads((runs / run_id / "result.json").read_text())
    assert result["status"] == "succeeded" and result["resumed_from"] == \
        {"attempt": 1, "update": 2}
    from contextlib import redirect_stdout
    from io import StringIO

    shown = StringIO()
    with redirect_stdout(shown):
        assert main(["runs", "show", "--runs-dir", str(runs), run_id]) == 0
    assert "attempt 2: succeeded, 6/6 updates, resumed from attempt 1 at update 2" in \
        " ".join(shown.getvalue().split())
    resumed = runs / run_id / "attempts" / "2" / "checkpoints" / "update-000006"
    weights = ["weights.safetensors"] + ([checkpoint.CRITIC_WEIGHTS] if kind == "ppo" else [])
    for name in weights:
        mine, theirs = load_file(str(resumed / name)), load_file(str(straight / name))
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), name
    # the optimizer (and the critic's) continue where they were, not from a fresh state
    for name in ["optimizer.pt"] + ([checkpoint.CRITIC_OPTIMIZER] if kind == "ppo" else []):
        mine = torch.load(resumed / name, weights_only=True)
        theirs = torch.load(straight / name, weights_only=True)
        for k, state in theirs["state"].items():
            assert all(torch.equal(state[f], mine["state"][k][f]) for f in state), name


def test_resume_under_other_package_versions_is_exit_6(finished, tmp_path, monkeypatch,
                                                       capsys):
    from stateset_backend.adapters.native import adapter as native

    _, _, _, run_id = finished
    plan, runs, _ = _interrupted_after_update_2(finished, tmp_path)
    installed = native.distribution_version
    monkeypatch.setattr(native, "distribution_version",
                        lambda name, python=None: "0.0.1" if name == "transformers" else
                        installed(name, python))
    assert main(["run", "--runs-dir", str(runs), "--resume", str(plan)]) == 6
    err = capsys.readouterr().err
    assert "transformers" in err and "-> 0.0.1" in err and "--allow-runtime-change" in err
    assert sorted(p.name for p in (runs / run_id / "attempts").iterdir()) == ["1"]
