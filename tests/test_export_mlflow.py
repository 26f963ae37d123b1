"""`runs export RUN --mlflow URI`: params, stepped metrics, identity tags and the artifact
manifest, read back with the real MLflow client from a local SQLite store."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from stateset_backend.cli import main
from stateset_backend.conformance.specs import MINIMAL
from stateset_backend.core.content import sha256_file
from stateset_backend.core.export import flatten, redact

pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs sqlalchemy")

SECRET = "hunter2-do-not-export"


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
        uri = f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"
        (root / "mlflow").mkdir()
        code, doc = _cli_json("runs", "export", "--runs-dir", str(runs), run_id,
                              "--mlflow", uri)
    assert code == 0, doc
    return runs, run_id, doc, uri


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


def test_export_refuses_an_unknown_run_or_attempt(exported):
    runs, run_id, _, uri = exported
    assert main(["runs", "export", "--runs-dir", str(runs), "nope", "--mlflow", uri]) == 2
    assert main(["runs", "export", "--runs-dir", str(runs), run_id, "--attempt", "9",
                 "--mlflow", uri]) == 2


def test_redaction_of_secret_looking_values():
    """A second line behind the spec's own refusal of credentials (older plans, new keys)."""
    from stateset_backend.core.export import _value

    assert _value("engine_options.x.wandb_api_key", "abc") == "***"
    assert _value("data.max_prompt_tokens", 48) == "48"
    assert redact("s3://bucket/x?X-Amz-Signature=abc&part=1") == \
        "s3://bucket/x?X-Amz-Signature=***&part=1"
    assert redact("postgresql://me:pw@host/db") == "postgresql://me:***@host/db"
    assert redact("plain text: with @ and ://") == "plain text: with @ and ://"
