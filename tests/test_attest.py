"""`attest RUN`: an in-toto Statement v1 whose subjects are the attempt's files with their
sha256 and whose predicate is the run's identity, checks and selection."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path

import pytest

from stateset_backend.cli import main
from stateset_backend.conformance.specs import MINIMAL
from stateset_backend.publish.attest import PREDICATE_TYPE
from stateset_backend.spec.content import sha256_file

pytest.importorskip("in_toto_attestation", reason="the attest extra is not installed")


@pytest.fixture
def run(tmp_path) -> tuple[Path, str]:
    """One echo run, retried once (two attempts); (runs dir, run id)."""
    (tmp_path / "data").mkdir()
    train = tmp_path / "data" / "train.jsonl"
    train.write_text('{"prompt": "p", "answer": "a"}\n' * 2)
    reward = tmp_path / "reward.py"
    reward.write_text("def score(prompt, response, answer):\n    return 1.0\n")
    spec = copy.deepcopy(MINIMAL)
    spec["data"]["train"]["sha256"] = sha256_file(train)
    spec["reward"]["sha256"] = sha256_file(reward)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["plan", "--engine", "echo", str(tmp_path / "spec.json"), "-o",
                 str(tmp_path / "plan.json")]) == 0
    runs = tmp_path / "runs"
    for retry in ([], ["--retry"]):
        assert main(["run", "--runs-dir", str(runs), "--quiet", *retry,
                     str(tmp_path / "plan.json")]) == 0
    return runs, json.loads((tmp_path / "plan.json").read_text())["run_id"]


def _validate(doc: dict) -> None:
    """The in-toto library's own parsing and validation of the written document."""
    from google.protobuf import json_format
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    Statement.copy_from_pb(json_format.ParseDict(doc, statement_pb2.Statement())).validate()


def test_the_statement_validates_and_every_subject_matches_its_file(run, tmp_path, capsys):
    runs, run_id = run
    out = tmp_path / "run.intoto.json"
    assert main(["attest", "--runs-dir", str(runs), run_id, "-o", str(out)]) == 0
    assert "in-toto statement" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    _validate(doc)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == PREDICATE_TYPE
    attempt = runs / run_id / "attempts" / "2"  # the newest attempt
    result = json.loads((attempt / "result.json").read_text())
    assert [s["name"] for s in doc["subject"]] == [a["path"] for a in result["artifacts"]]
    for subject in doc["subject"]:
        assert subject["digest"] == {"sha256": sha256_file(attempt / subject["name"])}
    pred = doc["predicate"]
    plan = json.loads((runs / run_id / "plan.json").read_text())
    assert pred["run"]["attempt"] == 2 and pred["run"]["status"] == "succeeded"
    assert (pred["experiment_digest"], pred["binding_digest"], pred["plan_checksum"]) == \
        (plan["experiment_digest"], plan["binding_digest"], plan["checksum"])
    assert pred["engine"] == {"name": "echo", "version": plan["engine_version"]}
    assert pred["adapter"] == plan["adapter"]
    assert pred["checks"] == result["checks"] and pred["selection"] == result["selection"]
    assert pred["result"]["sha256"] == sha256_file(attempt / "result.json")


def test_without_output_the_statement_goes_to_stdout_for_an_older_attempt(run, capsys):
    runs, run_id = run
    assert main(["attest", "--runs-dir", str(runs), run_id, "--attempt", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _validate(doc)
    assert doc["predicate"]["run"]["attempt"] == 1


def test_a_changed_or_missing_artifact_is_refused(run, tmp_path, capsys):
    runs, run_id = run
    attempt = runs / run_id / "attempts" / "2"
    result = json.loads((attempt / "result.json").read_text())
    target = attempt / result["artifacts"][0]["path"]
    target.write_bytes(target.read_bytes() + b"tampered")
    out = tmp_path / "refused.json"
    assert main(["attest", "--runs-dir", str(runs), run_id, "-o", str(out)]) == 5
    assert "no longer matches" in capsys.readouterr().err and not out.exists()
    target.unlink()
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert main(["attest", "--runs-dir", str(runs), run_id, "--json"]) == 5
    assert "missing" in json.loads(buf.getvalue())["error"]["message"]


def test_attest_refuses_an_unknown_run(run, capsys):
    runs, _ = run
    assert main(["attest", "--runs-dir", str(runs), "nope"]) == 2
