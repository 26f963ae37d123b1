"""`runs export RUN --mlflow URI`: params, stepped metrics, identity tags, the artifact
manifest and the held-out evaluations, read back with the real MLflow client from a local
SQLite store; a tracking server that is down or failing is one line within seconds."""

from __future__ import annotations

import copy
import http.server
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from stateset_backend.cli import main
from stateset_backend.common.jsonio import atomic_write_json
from stateset_backend.conformance.specs import MINIMAL
from stateset_backend.publish.export import CLIENT_ENVIRONMENT, flatten, redact
from stateset_backend.runs.evaluate import EVALUATION_SCHEMA_ID
from stateset_backend.spec.content import sha256_file

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = pytest.mark.xdist_group(__name__)

pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs sqlalchemy")

SECRET = "hunter2-do-not-export"
PROXIES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One echo run with a secret in the caller's environment (the spec itself refuses
    credentials), exported once; (runs dir, run id, export doc, tracking uri)."""
    root = tmp_path_factory.mktemp("export")
    (root / "data").mkdir()
    train = root / "data" / "train.jsonl"
    train.write_text('{"prompt": "p", "answer": "a"}\n' * 2)
    reward = root / "reward.py"
    reward.write_text("def score(prompt, response, answer):\n    return 1.0\n")
    spec = copy.deepcopy(MINIMAL)
    spec["data"]["train"]["sha256"] = sha256_file(train)
    spec["reward"]["sha256"] = sha256_file(reward)
    spec["labels"] = {"team": "support"}
    (root / "spec.json").write_text(json.dumps(spec))
    runs = root / "runs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STATESET_TEST_API_TOKEN", SECRET)
        assert main(["run", "--engine", "echo", "--runs-dir", str(runs), "--quiet",
                     str(root / "spec.json")]) == 0
        (run_id,) = [p.name for p in runs.iterdir() if (p / "plan.json").is_file()]
        _write_evaluation(runs, run_id, "test", 2, {"test/reward/mean": 0.75,
                                                    "test/response_tokens/mean": 12.0})
        _write_evaluation(runs, run_id, "test", 2, {"test/reward/mean": 0.1}, attempt=2)
        uri = f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"
        (root / "mlflow").mkdir()
        code, doc = _cli_json("runs", "export", "--runs-dir", str(runs), run_id,
                              "--mlflow", uri)
    assert code == 0, doc
    return runs, run_id, doc, uri


def _write_evaluation(runs: Path, run_id: str, split: str, update: int,
                      metrics: dict[str, float], *, attempt: int = 1,
                      started_at: str = "2025-01-02T03:04:05Z") -> dict:
    """A record as `evaluate` writes it (the echo engine declares no evaluator)."""
    plan = json.loads((runs / run_id / "plan.json").read_text())
    label = f"update-{update:06d}"
    doc = {"schema": EVALUATION_SCHEMA_ID, "run_id": run_id, "attempt": attempt,
           "experiment_digest": plan["experiment_digest"], "engine": plan["engine"],
           "engine_version": plan["engine_version"], "split": split,
           "data": {"uri": f"https://data.example/{split}.jsonl?X-Amz-Signature={SECRET}",
                    "sha256": "0" * 64},
           "checkpoint": {"requested": label, "update": update, "attempt": attempt,
                          "path": f"checkpoints/{label}", "files": {},
                          "manifest_sha256": None},
           "decoding": {"temperature": 0.0, "top_p": 1.0, "samples": 1,
                        "max_response_tokens": 16},
           "metrics": metrics, "started_at": started_at, "ended_at": "2025-01-02T03:04:09Z",
           "duration_s": 4.0}
    atomic_write_json(runs / run_id / "evaluations" /
                      f"{split}-attempt{attempt}-{label}.json", doc)
    return doc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli_json(*args: str) -> tuple[int, dict]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*args, "--json"])
    return code, json.loads(buf.getvalue())


def _result(runs: Path, run_id: str) -> dict:
    return json.loads((runs / run_id / "result.json").read_text())


def test_params_metrics_tags_and_manifest_read_back(exported, tmp_path):
    from mlflow.tracking import MlflowClient

    runs, run_id, doc, uri = exported
    result = _result(runs, run_id)
    plan = json.loads((runs / run_id / "plan.json").read_text())
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(doc["mlflow_run_id"])
    # params: every leaf of the validated spec, dotted
    params = run.data.params
    assert params["seed"] == str(plan["spec"]["seed"])
    assert params["algorithm.objective"] == plan["spec"]["algorithm"]["objective"]
    assert params["budget.total_updates"] == str(plan["spec"]["budget"]["total_updates"])
    assert params["data.train.sha256"] == plan["spec"]["data"]["train"]["sha256"]
    assert set(params) == set(flatten(plan["spec"]))
    # metrics with their steps
    series = [json.loads(line) for line in
              (runs / run_id / "attempts/1/canonical_metrics.jsonl").read_text().splitlines()]
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == \
        [(row["step"], row["reward/mean"]) for row in series]
    # tags: identity and status
    tags = run.data.tags
    for key in ("experiment_digest", "binding_digest", "plan_checksum", "engine",
                "engine_version", "run_id", "status"):
        assert tags[f"stateset.{key}"] == str(result[key])
    assert run.info.status == "FINISHED" and run.info.run_name == f"{run_id}#1"
    # the artifact manifest
    local = client.download_artifacts(run.info.run_id, "stateset/artifacts.json", str(tmp_path))
    manifest = json.loads(Path(local).read_text())
    assert manifest["artifacts"] == [
        {k: a[k] for k in ("path", "kind", "step", "bytes", "sha256")}
        for a in result["artifacts"]]
    assert manifest["artifacts"][0]["sha256"] == \
        sha256_file(runs / run_id / "attempts/1" / manifest["artifacts"][0]["path"])


def test_no_environment_value_or_secret_is_exported(exported):
    from mlflow.tracking import MlflowClient

    _, _, doc, uri = exported
    run = MlflowClient(tracking_uri=uri).get_run(doc["mlflow_run_id"])
    everything = json.dumps([run.data.params, run.data.tags, doc])
    assert SECRET not in everything and "ECHO_MARKER" not in everything
    assert run.data.params["labels.team"] == "support"


def test_exporting_again_logs_nothing_twice(exported):
    from mlflow.tracking import MlflowClient

    runs, run_id, doc, uri = exported
    code, again = _cli_json("runs", "export", "--runs-dir", str(runs), run_id, "--mlflow", uri)
    assert code == 0 and again["already_exported"]
    assert again["mlflow_run_id"] == doc["mlflow_run_id"]
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(doc["mlflow_run_id"], "reward/mean")
    assert len(history) == len({m.step for m in history})


def test_evaluations_are_exported_apart_from_training_metrics(exported, tmp_path):
    from mlflow.tracking import MlflowClient

    runs, run_id, doc, uri = exported
    assert doc["evaluations"] == ["test-attempt1-update-000002.json"]
    assert doc["evaluation_metric_points"] == 2
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(doc["mlflow_run_id"])
    # at the checkpoint's update, under the split, never in a training series
    assert [(m.step, m.value) for m in
            client.get_metric_history(run.info.run_id, "test/reward/mean")] == [(2, 0.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(
        run.info.run_id, "test/response_tokens/mean")] == [(2, 12.0)]
    assert not set(doc["metrics"]) & {"test/reward/mean", "test/response_tokens/mean"}
    # which checkpoint: a tag per record; attempt 2's record is not this attempt's
    tags = {k: v for k, v in run.data.tags.items() if k.startswith("stateset.evaluation.")}
    assert list(tags) == ["stateset.evaluation.test-attempt1-update-000002"]
    assert json.loads(tags["stateset.evaluation.test-attempt1-update-000002"]) == {
        "split": "test", "update": 2, "requested": "update-000002", "checkpoint_attempt": 1,
        "record": "test-attempt1-update-000002.json", "started_at": "2025-01-02T03:04:05Z"}
    # the record itself, its signed data URL redacted
    local = client.download_artifacts(
        run.info.run_id, "stateset/evaluations/test-attempt1-update-000002.json",
        str(tmp_path))
    record = json.loads(Path(local).read_text())
    written = json.loads((runs / run_id / "evaluations" /
                          "test-attempt1-update-000002.json").read_text())
    assert record["metrics"] == written["metrics"]
    assert record["checkpoint"] == written["checkpoint"]
    assert record["data"]["uri"] == \
        "https://data.example/test.jsonl?X-Amz-Signature=***"
    assert SECRET not in Path(local).read_text()


def test_an_evaluation_recorded_after_export_is_added_once(exported):
    from mlflow.tracking import MlflowClient

    runs, run_id, doc, uri = exported
    _write_evaluation(runs, run_id, "validation", 1, {"validation/reward/mean": 0.5})
    code, again = _cli_json("runs", "export", "--runs-dir", str(runs), run_id, "--mlflow", uri)
    assert code == 0 and again["already_exported"]
    assert again["evaluations"] == ["validation-attempt1-update-000001.json"]
    code, third = _cli_json("runs", "export", "--runs-dir", str(runs), run_id, "--mlflow", uri)
    assert code == 0 and third["evaluations"] == [] and \
        third["evaluations_changed_since_export"] == []
    client = MlflowClient(tracking_uri=uri)
    run_uuid = doc["mlflow_run_id"]
    assert [(m.step, m.value) for m in
            client.get_metric_history(run_uuid, "validation/reward/mean")] == [(1, 0.5)]
    assert [(m.step, m.value) for m in
            client.get_metric_history(run_uuid, "test/reward/mean")] == [(2, 0.75)]
    # evaluated again under the same name: said so, not logged a second time
    _write_evaluation(runs, run_id, "validation", 1, {"validation/reward/mean": 0.6},
                      started_at="2025-02-02T00:00:00Z")
    code, fourth = _cli_json("runs", "export", "--runs-dir", str(runs), run_id, "--mlflow",
                             uri)
    assert code == 0 and fourth["evaluations"] == []
    assert fourth["evaluations_changed_since_export"] == \
        ["validation-attempt1-update-000001.json"]
    assert len(client.get_metric_history(run_uuid, "validation/reward/mean")) == 1


def test_an_unreachable_tracking_server_is_one_line_within_seconds(exported, capsys,
                                                                   monkeypatch):
    runs, run_id, _, _ = exported
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
    for name in CLIENT_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    uri = f"http://127.0.0.1:{_free_port()}"
    capsys.readouterr()
    t0 = time.monotonic()
    code = main(["runs", "export", "--runs-dir", str(runs), run_id, "--mlflow", uri])
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and uri in err and "cannot connect" in err
    assert not set(CLIENT_ENVIRONMENT) & set(os.environ)  # restored


class _Unavailable(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_a_failing_tracking_server_is_retried_briefly(exported, capsys, monkeypatch):
    """A server that answers but keeps failing gets the bounded retries, not minutes."""
    runs, run_id, _, _ = exported
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
    for name in CLIENT_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        capsys.readouterr()
        t0 = time.monotonic()
        code = main(["runs", "export", "--runs-dir", str(runs), run_id, "--mlflow", uri])
        assert time.monotonic() - t0 < 30
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and f"MLflow store {uri}:" in err


def test_the_users_own_client_settings_are_kept(monkeypatch):
    from stateset_backend.publish.export import _client_environment

    for name in CLIENT_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "9")
    with _client_environment():
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "9"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == \
            CLIENT_ENVIRONMENT["MLFLOW_HTTP_REQUEST_TIMEOUT"]
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "9"
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ


def test_export_refuses_an_unknown_run_or_attempt(exported):
    runs, run_id, _, uri = exported
    assert main(["runs", "export", "--runs-dir", str(runs), "nope", "--mlflow", uri]) == 2
    assert main(["runs", "export", "--runs-dir", str(runs), run_id, "--attempt", "9",
                 "--mlflow", uri]) == 2


def test_redaction_of_secret_looking_values():
    """A second line behind the spec's own refusal of credentials (older plans, new keys)."""
    from stateset_backend.publish.export import _value

    assert _value("engine_options.x.wandb_api_key", "abc") == "***"
    assert _value("data.max_prompt_tokens", 48) == "48"
    assert redact("s3://bucket/x?X-Amz-Signature=abc&part=1") == \
        "s3://bucket/x?X-Amz-Signature=***&part=1"
    assert redact("postgresql://me:pw@host/db") == "postgresql://me:***@host/db"
    assert redact("plain text: with @ and ://") == "plain text: with @ and ://"
