"""The run store's index: listings and comparisons read it alone, page through a store of any
size, resolve prefixes from it, and it is rebuilt from the run folders whenever it cannot be
trusted."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from stateset_backend.cli import main
from stateset_backend.runs.results import Result
from stateset_backend.runs.store import Attempt, RunStore

DIGESTS = ("sha256:" + "1" * 64, "sha256:" + "2" * 64)


def _run_id(i: int) -> str:
    return f"20260101T{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}Z-{i:08x}"


def _result(run_id: str, attempt: int, digest: str, status: str = "succeeded") -> Result:
    return Result.model_validate({
        "schema": "stateset-backend/result/v1", "run_id": run_id, "attempt": attempt,
        "experiment_digest": digest, "binding_digest": "sha256:" + "b" * 64,
        "plan_checksum": "sha256:" + "c" * 64, "engine": "echo", "engine_version": "1.0",
        "provider": "local", "status": status, "exit_code": 0 if status == "succeeded" else 1,
        "started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-01-01T00:10:00Z",
        "duration_s": 600.0, "planned_updates": 4, "committed_updates": 4,
        "metrics": {"series": None, "summary": {"reward/mean": 0.5, "val/reward/mean": 0.7},
                    "raw_names": {}},
        "selection": None, "deviations": [{"deviation": "no_kl_clamp"}], "artifacts": [],
        "checks": [] if status == "succeeded" else [{"name": "exit_code", "ok": False,
                                                      "detail": "engine exited 1"}]})


def _add(root: Path, i: int, attempts: int = 1) -> str:
    """A finished run as the runner leaves it, not yet indexed."""
    run_id = _run_id(i)
    digest = DIGESTS[i % 2]
    (root / run_id).mkdir(parents=True)
    (root / run_id / "plan.json").write_text(json.dumps({
        "run_id": run_id, "experiment_digest": digest, "engine": "echo",
        "engine_version": "1.0", "checksum": "sha256:" + "c" * 64, "spec": {"seed": 1}}))
    for n in range(1, attempts + 1):
        doc = _result(run_id, n, digest, "failed" if n < attempts else "succeeded").to_json()
        (root / run_id / "attempts" / str(n)).mkdir(parents=True)
        (root / run_id / "attempts" / str(n) / "result.json").write_text(json.dumps(doc))
    (root / run_id / "result.json").write_text(json.dumps(doc))
    return run_id


@pytest.fixture
def many(tmp_path):
    """120 runs of two experiments, every seventh retried once, indexed."""
    root = tmp_path / "runs"
    ids = [_add(root, i, attempts=2 if i % 7 == 0 else 1) for i in range(120)]
    RunStore(root).reindex()
    return root, ids


def _json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


PROBE = """
import json, os, sys
root = os.path.realpath(sys.argv[1])
touched = set()

def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and \\
            isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path.startswith(root + os.sep):
            touched.add(os.path.relpath(path, root))

sys.addaudithook(hook)
from stateset_backend.cli import main
code = main(sys.argv[2:])
print("TOUCHED=" + json.dumps(sorted(touched)))
sys.exit(code)
"""


def _touched(root: Path, *args: str) -> list[str]:
    """The paths under the store a fresh CLI process opens or lists for ``args``."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(root), *args,
                           "--runs-dir", str(root)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = [x for x in proc.stdout.splitlines() if x.startswith("TOUCHED=")][-1]
    return json.loads(line[len("TOUCHED="):])


def test_list_and_compare_open_no_run_folder_and_show_only_its_own(many):
    root, ids = many
    index_only = {"index.sqlite", ".quarantined"}
    for args in (["runs", "list"], ["runs", "list", "--json", "--all"],
                 ["runs", "list", "--status", "failed"],
                 ["runs", "compare", DIGESTS[0][7:19]],
                 ["runs", "compare", "--json", ids[5], ids[-1]],
                 ["runs", "list", "--digest", DIGESTS[1][:20]]):
        assert set(_touched(root, *args)) <= index_only, args
    shown = _touched(root, "runs", "show", ids[7][:-1])
    assert shown and all(p in index_only or p.startswith(ids[7]) for p in shown), shown


def test_listings_stand_on_the_index_after_the_files_are_gone(many, capsys):
    root, ids = many
    listed = _json(capsys, "runs", "list", "--runs-dir", str(root), "--all")
    compared = _json(capsys, "runs", "compare", "--runs-dir", str(root), DIGESTS[0], "--all")
    for path in root.glob("*/**/result.json"):
        path.unlink()
    assert _json(capsys, "runs", "list", "--runs-dir", str(root), "--all") == listed
    assert _json(capsys, "runs", "compare", "--runs-dir", str(root), DIGESTS[0],
                 "--all") == compared
    assert listed["total"] == 120 and compared["runs"] == 60
    retried = next(r for r in compared["attempts"] if r["run_id"] == ids[0])
    assert (retried["attempt"], retried["status"], retried["reason"]) == \
        (1, "failed", "exit_code: engine exited 1")
    assert retried["final"] == {"reward/mean": 0.5, "val/reward/mean": 0.7}
    assert retried["deviations"] == ["no_kl_clamp"]


def test_a_listing_pages_newest_first_and_says_how_many_more(many, capsys, monkeypatch):
    root, ids = many
    newest = ids[::-1]
    first = _json(capsys, "runs", "list", "--runs-dir", str(root))
    assert [r["run_id"] for r in first["runs"]] == newest[:50]
    assert (first["total"], first["more"], first["page"], first["limit"]) == (120, 70, 1, 50)
    assert [r["attempt"] for r in first["runs"] if r["run_id"] == ids[112]] == [2]
    last = _json(capsys, "runs", "list", "--runs-dir", str(root), "--page", "3")
    assert [r["run_id"] for r in last["runs"]] == newest[100:] and last["more"] == 0
    page = _json(capsys, "runs", "list", "--runs-dir", str(root), "--limit", "10",
                 "--page", "2", "--digest", DIGESTS[0])
    assert [r["run_id"] for r in page["runs"]] == [r for r in newest if
                                                   int(r[-8:], 16) % 2 == 0][10:20]
    assert (page["total"], page["more"]) == (60, 40)
    everything = _json(capsys, "runs", "list", "--runs-dir", str(root), "--all")
    assert len(everything["runs"]) == 120 and everything["more"] == 0
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["runs", "list", "--runs-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "runs 1-50 of 120, newest first" in out
    assert "70 more runs: --page 2 for the next 50, --all for all 120" in out
    assert max(map(len, out.splitlines())) <= 80
    assert main(["runs", "list", "--runs-dir", str(root), "--page", "9"]) == 0
    assert "no runs on page 9: 120 make 3 page(s) of 50" in capsys.readouterr().out
    for bad in (["--all", "--page", "2"], ["--limit", "0"], ["--page", "0"],
                ["--all", "--limit", "5"]):
        assert main(["runs", "list", "--runs-dir", str(root), *bad]) == 2, bad


def test_compare_pages_the_runs_of_an_experiment(many, capsys):
    root, ids = many
    doc = _json(capsys, "runs", "compare", "--runs-dir", str(root), DIGESTS[1][7:19],
                "--limit", "4")
    shown = list(dict.fromkeys(r["run_id"] for r in doc["attempts"]))
    assert shown == [r for r in ids[::-1] if int(r[-8:], 16) % 2 == 1][:4]
    assert (doc["runs"], doc["more_runs"], doc["experiment_digests"]) == (60, 56, [DIGESTS[1]])
    assert main(["runs", "compare", "--runs-dir", str(root), DIGESTS[1][7:19]]) == 0
    out = capsys.readouterr().out
    assert "runs 1-50 of 60, newest first" in out
    assert "10 more runs: --page 2 for the next 10, --all for all 60" in out


def test_prefixes_resolve_from_the_index(many, capsys):
    root, ids = many
    assert _json(capsys, "runs", "show", "--runs-dir", str(root), ids[42][:-2])["run_id"] \
        == ids[42]
    assert main(["runs", "show", "--runs-dir", str(root), "20260101T0000"]) == 2
    assert "ambiguous, 60 match: " + ", ".join(ids[:5]) + ", ..." in capsys.readouterr().err
    # a run folder copied in is found by its whole id at once, by a prefix once reindexed
    copied = _run_id(9999)
    shutil.copytree(root / ids[1], root / copied)
    assert _json(capsys, "runs", "show", "--runs-dir", str(root), copied)["run_id"] == copied
    assert main(["runs", "show", "--runs-dir", str(root), copied[:-1]]) == 2
    assert "no run or experiment digest" in capsys.readouterr().err
    assert main(["runs", "reindex", "--runs-dir", str(root)]) == 0
    assert _json(capsys, "runs", "show", "--runs-dir", str(root), copied[:-1])["run_id"] == \
        copied
    # a run removed since it was indexed is not named by its prefix
    shutil.rmtree(root / ids[3])
    assert main(["runs", "show", "--runs-dir", str(root), ids[3][:-1]]) == 2
    assert "no run or experiment digest" in capsys.readouterr().err


def test_an_index_of_an_older_layout_is_rebuilt(many, capsys):
    root, ids = many
    (root / "index.sqlite").unlink()
    with closing(sqlite3.connect(root / "index.sqlite")) as conn:  # the first index's layout
        conn.execute("CREATE TABLE attempts (run_id TEXT, attempt INTEGER, experiment_digest "
                     "TEXT, binding_digest TEXT, plan_checksum TEXT, engine TEXT, "
                     "engine_version TEXT, status TEXT, exit_code INTEGER, committed_updates "
                     "INTEGER, planned_updates INTEGER, started_at TEXT, ended_at TEXT, "
                     "deviations INTEGER, PRIMARY KEY (run_id, attempt))")
        conn.execute("INSERT INTO attempts VALUES ('x', 1, '', '', '', 'e', 'v', "
                     "'succeeded', 0, 1, 1, '', '', 0)")
        conn.commit()
    assert _json(capsys, "runs", "list", "--runs-dir", str(root))["total"] == 120
    assert _json(capsys, "runs", "show", "--runs-dir", str(root), ids[9][:-1])["run_id"] == \
        ids[9]


def test_a_result_finished_without_an_index_rebuilds_it_whole(many, capsys):
    root, _ = many
    (root / "index.sqlite").unlink()
    store = RunStore(root)
    run_id = _run_id(500)
    (root / run_id / "attempts" / "1").mkdir(parents=True)
    (root / run_id / "plan.json").write_text(json.dumps({"run_id": run_id}))
    store.finish(Attempt(run_id, 1, root / run_id / "attempts" / "1"),
                 _result(run_id, 1, DIGESTS[0]))
    listed = _json(capsys, "runs", "list", "--runs-dir", str(root))
    assert listed["total"] == 121 and listed["runs"][0]["run_id"] == run_id


def test_quarantine_notes_follow_the_markers_and_reindex(many, capsys):
    from stateset_backend.runs import quarantine

    root, ids = many
    quarantine.mark(root / ids[4], fault="restore", reason="damaged", update=2, attempt=1)
    quarantine.mark(root / ids[4] / "attempts" / "1", fault="restore", reason="in the attempt")
    assert sorted(p.name for p in (root / ".quarantined").iterdir()) == [ids[4]]

    def quarantined() -> list[str]:
        return [r["run_id"] for r in _json(capsys, "runs", "list", "--runs-dir", str(root),
                                           "--status", "quarantined")["runs"]]

    assert quarantined() == [ids[4]]
    failed = _json(capsys, "runs", "list", "--runs-dir", str(root), "--status", "failed",
                   "--all")
    assert ids[4] not in {r["run_id"] for r in failed["runs"]}
    shutil.rmtree(root / ".quarantined")  # lost: `runs reindex` reads the markers again
    assert main(["runs", "reindex", "--runs-dir", str(root)]) == 0
    assert quarantined() == [ids[4]]
    quarantine.clear(root / ids[4], {"update": 2})
    assert quarantined() == [] and not (root / ".quarantined" / ids[4]).exists()


def test_evaluations_are_indexed_as_recorded_and_when_reindexed(many, capsys):
    root, ids = many
    record = {"schema": "stateset-backend/evaluation/v1", "run_id": ids[1], "attempt": 1,
              "split": "test", "checkpoint": {"requested": "final", "update": 4},
              "metrics": {"test/reward/mean": 0.25}}
    (root / ids[1] / "evaluations").mkdir()
    (root / ids[1] / "evaluations" / "test-attempt1-update-000004.json").write_text(
        json.dumps(record))
    RunStore(root).record_evaluation(ids[1], "test-attempt1-update-000004.json", record)
    expected = [{"record": "test-attempt1-update-000004.json", "attempt": 1, "split": "test",
                 "checkpoint": "final", "update": 4, "metrics": {"test/reward/mean": 0.25}}]
    for _ in range(2):
        (row,) = _json(capsys, "runs", "compare", "--runs-dir", str(root), ids[1])["attempts"]
        assert row["test"] == expected
        assert main(["runs", "reindex", "--runs-dir", str(root)]) == 0


def _finish_runs(root: str, first: int, count: int) -> None:
    store = RunStore(Path(root))
    for i in range(first, first + count):
        run_id = _run_id(i)
        folder = Path(root) / run_id / "attempts" / "1"
        folder.mkdir(parents=True)
        (Path(root) / run_id / "plan.json").write_text(json.dumps({"run_id": run_id}))
        store.finish(Attempt(run_id, 1, folder), _result(run_id, 1, DIGESTS[i % 2]))


def test_concurrent_runs_each_add_their_rows(tmp_path, capsys):
    """Four processes finish runs into one store with no index yet: the first to write builds
    it, every other waits for the lock; no row is lost."""
    from concurrent.futures import ProcessPoolExecutor

    root = tmp_path / "runs"
    root.mkdir()
    with ProcessPoolExecutor(4) as pool:
        list(pool.map(_finish_runs, [str(root)] * 4, range(0, 40, 10), [10] * 4))
    listed = _json(capsys, "runs", "list", "--runs-dir", str(root), "--all")
    assert sorted(r["run_id"] for r in listed["runs"]) == [_run_id(i) for i in range(40)]
