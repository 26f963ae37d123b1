"""The run store as an interface: list, show, compare and reindex, from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stateset_backend.cli import main
from stateset_backend.runs.results import (
    ArtifactRecord,
    SavedCheckpoint,
    saved_checkpoints,
    select_checkpoint,
)


@pytest.fixture
def store(tmp_path, minimal_with_files, capsys):
    """Two runs of one experiment on the echo engine, and one run of another experiment."""
    minimal = minimal_with_files
    runs = tmp_path / "runs"
    for i, seed in enumerate((7, 7, 8)):
        spec = tmp_path / f"spec{i}.json"
        spec.write_text(json.dumps({**minimal, "seed": seed}))
        assert main(["run", "--engine", "echo", "--runs-dir", str(runs), "--quiet",
                     str(spec)]) == 0
    capsys.readouterr()
    return runs


def _json(capsys, *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_filters_by_digest_engine_and_status(store, capsys):
    runs = _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"]
    assert len(runs) == 3 and {r["engine"] for r in runs} == {"echo"}
    digests = [r["experiment_digest"] for r in runs]
    twice = max(set(digests), key=digests.count)
    same = _json(capsys, "runs", "list", "--runs-dir", str(store), "--digest", twice)["runs"]
    assert len(same) == 2
    assert _json(capsys, "runs", "list", "--runs-dir", str(store), "--status",
                 "failed")["runs"] == []


def test_show_gives_identity_attempts_and_checks(store, capsys):
    run_id = _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"][0]["run_id"]
    doc = _json(capsys, "runs", "show", "--runs-dir", str(store), run_id)
    assert doc["plan_checksum"].startswith("sha256:") and doc["seed"] in (7, 8)
    assert doc["attempts"][0]["status"] == "succeeded"
    assert main(["runs", "show", "--runs-dir", str(store), "nope"]) == 2


def test_compare_puts_one_experiment_side_by_side(store, capsys):
    runs = _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"]
    digests = [r["experiment_digest"] for r in runs]
    twice = max(set(digests), key=digests.count)
    doc = _json(capsys, "runs", "compare", "--runs-dir", str(store), twice)
    assert doc["same_experiment"] and len(doc["attempts"]) == 2
    mixed = _json(capsys, "runs", "compare", "--runs-dir", str(store),
                  *[r["run_id"] for r in runs])
    assert not mixed["same_experiment"] and len(mixed["attempts"]) == 3
    assert main(["runs", "compare", "--runs-dir", str(store), "no-such-run"]) == 2


def test_the_human_tables_keep_ids_and_digests_whole_in_80_columns(store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    runs = _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"]
    assert main(["runs", "compare", "--runs-dir", str(store),
                 *[r["run_id"] for r in runs]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80
    for r in runs:  # each run id is on one line, to copy it whole
        assert any(f"{r['run_id']}#{r['attempt']}" in line for line in lines), lines
    assert main(["runs", "show", "--runs-dir", str(store), runs[0]["run_id"]]) == 0
    out = capsys.readouterr().out
    assert f"  experiment\n    {runs[0]['experiment_digest']}\n" in out
    assert max(map(len, out.splitlines())) <= 80  # so the terminal never breaks a digest
    assert main(["runs", "list", "--runs-dir", str(store)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80
    for r in runs:  # the run id and the digest prefix it shows are each whole on one line
        assert any(r["run_id"] in line and r["experiment_digest"][7:19] in line
                   for line in lines), lines


def test_the_prefixes_a_listing_shows_name_runs_and_experiments(store, capsys):
    runs = _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"]
    digests = [r["experiment_digest"] for r in runs]
    twice = max(set(digests), key=digests.count)
    short = twice[7:19]  # what `runs list` prints
    for given in (short, f"sha256:{short}"):
        assert len(_json(capsys, "runs", "list", "--runs-dir", str(store), "--digest",
                         given)["runs"]) == 2
        doc = _json(capsys, "runs", "compare", "--runs-dir", str(store), given)
        assert doc["experiment_digests"] == [twice] and len(doc["attempts"]) == 2
    run_id = runs[0]["run_id"]
    assert _json(capsys, "runs", "show", "--runs-dir", str(store),
                 run_id[:-3])["run_id"] == run_id
    # the three runs share their timestamp's first digits: that prefix is ambiguous
    assert main(["runs", "show", "--runs-dir", str(store), run_id[:4]]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and run_id in err
    assert main(["runs", "show", "--runs-dir", str(store), short]) == 2
    assert "not one run" in capsys.readouterr().err
    assert main(["runs", "list", "--runs-dir", str(store), "--digest", short[:5]]) == 2
    assert "needs 8 hex digits" in capsys.readouterr().err
    out = Path(store).parent / "page.html"
    assert main(["report", "--runs-dir", str(store), short, "-o", str(out)]) == 0
    assert twice in out.read_text()


def test_a_quarantined_run_lists_as_quarantined_until_verified(store, capsys):
    from stateset_backend.runs import quarantine

    run_id = _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"][0]["run_id"]
    quarantine.mark(Path(store) / run_id, fault="restore", reason="damaged", update=2,
                    attempt=1)  # what a resume that found a damaged checkpoint writes
    listed = _json(capsys, "runs", "list", "--runs-dir", str(store), "--status",
                   "quarantined")["runs"]
    assert [(r["run_id"], r["attempt_status"]) for r in listed] == [(run_id, "succeeded")]
    quarantine.clear(Path(store) / run_id, {"update": 2})
    assert _json(capsys, "runs", "list", "--runs-dir", str(store), "--status",
                 "quarantined")["runs"] == []


def test_an_unreadable_result_is_listed_as_such_never_dropped(store, capsys):
    runs = _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"]
    run_id = runs[0]["run_id"]
    (Path(store) / run_id / "attempts" / "1" / "result.json").write_text("{broken")
    doc = _json(capsys, "runs", "reindex", "--runs-dir", str(store))
    assert doc["indexed_attempts"] == 3 and len(doc["unreadable"]) == 1
    assert "result.json" in doc["unreadable"][0]
    listed = {r["run_id"]: r for r in
              _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"]}
    assert listed[run_id]["status"] == "unreadable"
    assert [r["run_id"] for r in _json(capsys, "runs", "list", "--runs-dir", str(store),
                                       "--status", "unreadable")["runs"]] == [run_id]
    assert listed[run_id]["experiment_digest"] == runs[0]["experiment_digest"]


def test_a_report_of_an_experiment_survives_one_unreadable_run(store, capsys, tmp_path):
    runs = _json(capsys, "runs", "list", "--runs-dir", str(store))["runs"]
    digests = [r["experiment_digest"] for r in runs]
    twice = max(set(digests), key=digests.count)
    broken, kept = [r["run_id"] for r in runs if r["experiment_digest"] == twice]
    (Path(store) / broken / "plan.json").write_text("{broken")
    out = tmp_path / "page.html"
    doc = _json(capsys, "report", "--runs-dir", str(store), twice, "-o", str(out))
    assert doc["runs"] == [kept] and len(doc["not_shown"]) == 1
    page = out.read_text()
    assert "Not shown" in page and broken in page


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_a_lost_index_loses_nothing(store, capsys, damage):
    index = Path(store) / "index.sqlite"
    if damage == "delete":
        index.unlink()
    else:
        index.write_bytes(b"not a database")
    assert len(_json(capsys, "runs", "list", "--runs-dir", str(store))["runs"]) == 3
    assert _json(capsys, "runs", "reindex", "--runs-dir", str(store)) == \
        {"indexed_attempts": 3, "unreadable": []}


def _ckpt(step: int) -> ArtifactRecord:
    return ArtifactRecord(path=f"checkpoints/update-{step:06d}/weights.safetensors",
                          kind="checkpoint", step=step, bytes=1, sha256="0" * 64)


def _saved(*steps: int, attempt: int = 1) -> dict[int, SavedCheckpoint]:
    return saved_checkpoints(attempt, [_ckpt(s) for s in steps])


def test_selection_prefers_the_best_validated_checkpoint_and_the_earlier_on_a_tie():
    rows = [{"step": 2, "val/reward/mean": 0.5}, {"step": 4, "val/reward/mean": 0.9},
            {"step": 6, "val/reward/mean": 0.9}, {"step": 8, "val/reward/mean": 1.0}]
    chosen = select_checkpoint("val/reward/mean", rows, _saved(2, 4, 6))
    assert chosen is not None
    assert (chosen["update"], chosen["value"]) == (4, 0.9)  # 8 has no checkpoint
    assert chosen["checkpoint"] == "checkpoints/update-000004" and chosen["attempt"] == 1
    loss = select_checkpoint("val/loss", [{"step": 2, "val/loss": 0.3},
                                          {"step": 4, "val/loss": 0.1}], _saved(2, 4))
    assert loss is not None and loss["update"] == 4 and loss["direction"] == "min"
    failed = select_checkpoint("val/conversations/failed_share",
                               [{"step": 2, "val/conversations/failed_share": 0.5},
                                {"step": 4, "val/conversations/failed_share": 0.0}],
                               _saved(2, 4))
    assert failed is not None and failed["update"] == 4 and failed["direction"] == "min"
    none = select_checkpoint("val/reward/mean", rows, _saved(3))
    assert none is not None and none["update"] is None
    assert "validated: 2, 4, 6, 8; checkpoints: 3" in none["reason"]
    never = select_checkpoint("val/loss", rows, _saved(2))
    assert never is not None and never["reason"] == "no row reported val/loss"
    assert select_checkpoint(None, rows, _saved(2)) is None


def test_a_misspelt_selection_metric_is_refused_when_the_spec_is_read(minimal):
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.spec.files import parse_spec

    doc = minimal
    doc.setdefault("evaluation", {})["select_by"] = "val/reward/maen"
    with pytest.raises(InvalidInput, match="'val/reward/maen' is not a validation metric"):
        parse_spec(doc)
