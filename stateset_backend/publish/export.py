"""Export one attempt to an MLflow tracking store, so runs can sit next to the rest of a team's
experiments: the spec's fields as params, the canonical metrics with their steps, the identity
as tags and the artifact manifest (path, sha256, bytes) as a JSON artifact. The attempt's
held-out evaluations (`evaluate`) go to the same run, apart from the training series: their
``<split>/...`` metrics at the evaluated checkpoint's update, a tag per record naming the
checkpoint and the record itself as a JSON artifact.

Only what the plan and result record is exported. Environment variables are never read or
sent (the plan keeps their names only), and values under a secret-looking key, URL
passwords and secret-looking query parameters are replaced by ``***``. mlflow is imported only
when an export runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from stateset_backend import __version__
from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.common.jsonio import flatten
from stateset_backend.runs.attempts import AttemptRecord, read_series
from stateset_backend.runs.evaluations import records as evaluation_records

MANIFEST_ARTIFACT = "stateset/artifacts.json"
EVALUATION_ARTIFACTS = "stateset/evaluations"
TAG = "stateset."
EVALUATION_TAG = f"{TAG}evaluation."
REDACTED = "***"
# MLflow's documented limits (param values 6000 characters, names 250) and the characters
# it accepts in a param or metric name.
MAX_VALUE, MAX_NAME = 6000, 250
_NAME_FORBIDDEN = re.compile(r"[^A-Za-z0-9_\-. :/]")
_SECRET_KEY = re.compile(r"(^|[_.\-])(secret|password|passwd|token|api_?key|access_?key|"
                         r"private_?key|credentials?|auth)([_.\-]|$)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^/:@\s]*):[^/@\s]*@")
_SECRET_QUERY = re.compile(r"([?&][^=&#\s]*(?:token|sig|signature|secret|password|key)"
                           r"[^=&#\s]*=)[^&#\s]*", re.IGNORECASE)
_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "invalid": "FAILED",
           "interrupted": "KILLED", "prepared": "SCHEDULED"}
# The MLflow client's own defaults retry an unanswered request for about four minutes; an
# export is run by hand and should fail within seconds. Used only where the user set none.
CLIENT_ENVIRONMENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                      "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                      "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
                      "MLFLOW_DISABLE_TELEMETRY": "true"}  # no usage reports from here
CONNECT_TIMEOUT_S = 5.0


def redact(text: str) -> str:
    """A URL's password and secret-looking query values replaced by ``***``."""
    return _SECRET_QUERY.sub(lambda m: m.group(1) + REDACTED,
                             _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text))


def _secret(key: str) -> bool:
    return any(_SECRET_KEY.search(part) for part in key.split("."))


def _value(key: str, value: Any) -> str:
    if _secret(key):
        return REDACTED
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = redact(text)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 14] + "...(truncated)"


def _name(key: str) -> str:
    return _NAME_FORBIDDEN.sub("_", key)[:MAX_NAME]


def params_of(record: AttemptRecord) -> dict[str, str]:
    """The validated spec's fields (defaults filled), flattened to dotted names."""
    return {_name(k): _value(k, v) for k, v in flatten(record.plan.get("spec") or {}).items()}


def tags_of(record: AttemptRecord) -> dict[str, str]:
    r = record.result
    adapter = record.plan.get("adapter") or {}
    return {
        f"{TAG}run_id": r.run_id, f"{TAG}attempt": str(r.attempt),
        f"{TAG}experiment_digest": r.experiment_digest,
        f"{TAG}binding_digest": r.binding_digest, f"{TAG}plan_checksum": r.plan_checksum,
        f"{TAG}engine": r.engine, f"{TAG}engine_version": r.engine_version,
        f"{TAG}adapter": redact(f"{adapter.get('distribution', '?')} "
                                f"{adapter.get('version', '')}".strip()),
        f"{TAG}provider": r.provider, f"{TAG}status": r.status,
        f"{TAG}committed_updates": str(r.committed_updates),
        f"{TAG}planned_updates": str(r.planned_updates),
        f"{TAG}deviations": str(len(r.deviations)),
        f"{TAG}exported_by": f"stateset-backend {__version__}",
    }


def manifest_of(record: AttemptRecord) -> dict[str, Any]:
    r = record.result
    return {"run_id": r.run_id, "attempt": r.attempt, "experiment_digest": r.experiment_digest,
            "binding_digest": r.binding_digest,
            "artifacts": [{"path": a.path, "kind": a.kind, "step": a.step, "bytes": a.bytes,
                           "sha256": a.sha256} for a in r.artifacts]}


def metric_points(record: AttemptRecord) -> list[tuple[str, float, int]]:
    """(name, value, step) of every numeric canonical metric, in series order."""
    points = []
    for row in read_series(record):
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        for name, value in row.items():
            if name != "step" and isinstance(value, int | float) and \
                    not isinstance(value, bool):
                points.append((_name(name), float(value), step))
    return points


def _redacted(doc: Any, key: str = "") -> Any:
    if key and _secret(key):
        return REDACTED
    if isinstance(doc, dict):
        return {k: _redacted(v, str(k)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_redacted(v) for v in doc]
    return redact(doc) if isinstance(doc, str) else doc


def evaluations_of(record: AttemptRecord) -> list[dict[str, Any]]:
    """The held-out evaluation records of this attempt, oldest name first. Another attempt's
    records belong to that attempt's MLflow run."""
    return [doc for doc in evaluation_records(record.directory.parent.parent)
            if doc.get("attempt") == record.result.attempt]


def evaluation_points(doc: dict[str, Any]) -> list[tuple[str, float, int]] | None:
    """(name, value, step) of an evaluation's numeric metrics, named under its split so they
    never join a training series, at the evaluated checkpoint's update; None when the record
    names no update to put them at."""
    update = (doc.get("checkpoint") or {}).get("update")
    split = doc.get("split")
    if not isinstance(update, int) or isinstance(update, bool) or not isinstance(split, str):
        return None
    points = []
    for name, value in sorted((doc.get("metrics") or {}).items()):
        if isinstance(value, int | float) and not isinstance(value, bool):
            full = name if name.startswith(f"{split}/") else f"{split}/{name}"
            points.append((_name(full), float(value), update))
    return points


def evaluation_tag(doc: dict[str, Any]) -> tuple[str, str]:
    """The tag that records which checkpoint an evaluation scored; its presence on the MLflow
    run is also what keeps a second export from logging the evaluation again."""
    checkpoint = doc.get("checkpoint") or {}
    return (_name(EVALUATION_TAG + Path(doc["record"]).stem),
            json.dumps({"split": doc.get("split"), "update": checkpoint.get("update"),
                        "requested": checkpoint.get("requested"),
                        "checkpoint_attempt": checkpoint.get("attempt"),
                        "record": doc["record"], "started_at": doc.get("started_at")},
                       sort_keys=True))


def _tagged_start(value: str) -> Any:
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    return doc.get("started_at") if isinstance(doc, dict) else None


def _millis(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


@contextmanager
def _client_environment() -> Iterator[None]:
    """Bounded retries for the length of the export; a variable the user set is theirs, and
    the process environment is as it was afterwards."""
    added = [name for name in CLIENT_ENVIRONMENT if name not in os.environ]
    for name in added:
        os.environ[name] = CLIENT_ENVIRONMENT[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _check_reachable(tracking_uri: str, shown_uri: str) -> None:
    """One direct connection to an HTTP tracking server, so a server that is down or a wrong
    port is one line at once rather than the client's retries. Through a proxy the server is
    not connected to directly; the bounded retries alone apply there."""
    parts = urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https"):
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InvalidInput(f"MLflow store {shown_uri}: not a valid port") from None
    host = parts.hostname
    if not host:
        raise InvalidInput(f"MLflow store {shown_uri}: the URI names no host")
    from requests.utils import get_environ_proxies

    if get_environ_proxies(tracking_uri):
        return
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except TimeoutError:
        reason = f"no answer within {CONNECT_TIMEOUT_S:g} s"
    except socket.gaierror as exc:
        reason = f"unknown host ({exc.strerror or exc})"
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    else:
        return
    raise InvalidInput(f"MLflow store {shown_uri}: cannot connect to {host}:{port} "
                       f"({reason}); is the tracking server running?")


def _artifact_location(uri: str) -> str | None:
    """For a local SQLite store, artifacts go next to the database (MLflow's own default is
    ./mlruns under whatever folder the command runs in)."""
    parts = urlsplit(uri)
    if parts.scheme != "sqlite" or not parts.path or parts.path == "/:memory:":
        return None
    db = Path(unquote(parts.path[1:] if parts.path.startswith("//") else parts.path))
    return (db.resolve().parent / "mlartifacts").as_uri()


def export_mlflow(record: AttemptRecord, tracking_uri: str, *,
                  experiment_name: str | None = None) -> dict[str, Any]:
    """Log the attempt as one MLflow run; exporting the same attempt again finds that run
    and logs nothing twice, only the evaluations recorded since."""
    shown_uri = redact(tracking_uri)
    with _client_environment():
        try:
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise Unsupported("exporting to MLflow needs mlflow: pip install "
                              "'stateset-backend[mlflow]'") from None
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        _check_reachable(tracking_uri, shown_uri)
        try:
            return _export(MlflowClient(tracking_uri=tracking_uri), record, tracking_uri,
                           shown_uri, experiment_name)
        except (MlflowException, OSError) as exc:  # requests' errors are OSErrors
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            raise InvalidInput(f"MLflow store {shown_uri}: {redact(lines[0])}") from None


def _export(client: Any, record: AttemptRecord, tracking_uri: str, shown_uri: str,
            experiment_name: str | None) -> dict[str, Any]:
    from mlflow.entities import Metric, Param

    r = record.result
    spec_name = (record.plan.get("spec") or {}).get("name") or "experiment"
    experiment_name = experiment_name or f"{spec_name} {r.experiment_digest[:19]}"
    experiment = client.get_experiment_by_name(experiment_name)
    experiment_id = experiment.experiment_id if experiment is not None else \
        client.create_experiment(experiment_name,
                                 artifact_location=_artifact_location(tracking_uri),
                                 tags={f"{TAG}experiment_digest": r.experiment_digest})
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{TAG}run_id` = '{r.run_id}' and "
                                       f"tags.`{TAG}attempt` = '{r.attempt}'",
        max_results=1)
    if found:
        run_id = found[0].info.run_id
        return {"tracking_uri": shown_uri, "experiment_id": experiment_id,
                "mlflow_run_id": run_id, "already_exported": True,
                **_export_evaluations(client, run_id, record, found[0].data.tags)}
    run = client.create_run(experiment_id, start_time=_millis(r.started_at),
                            tags=tags_of(record), run_name=f"{r.run_id}#{r.attempt}")
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in params_of(record).items()]
    stamp = _millis(r.started_at)
    metrics = [Metric(k, v, stamp, step) for k, v, step in metric_points(record)]
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i:i + 100])
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    client.log_dict(run_id, manifest_of(record), MANIFEST_ARTIFACT)
    evaluations = _export_evaluations(client, run_id, record, {})
    client.set_terminated(run_id, status=_STATUS.get(r.status, "FAILED"),
                          end_time=_millis(r.ended_at))
    return {"tracking_uri": shown_uri, "experiment_id": experiment_id,
            "experiment_name": experiment_name, "mlflow_run_id": run_id,
            "already_exported": False, "params": len(params), "metric_points": len(metrics),
            "metrics": sorted({m.key for m in metrics}),
            "artifacts_listed": len(r.artifacts), "manifest": MANIFEST_ARTIFACT,
            **evaluations}


def _export_evaluations(client: Any, run_id: str, record: AttemptRecord,
                        tags: dict[str, str]) -> dict[str, Any]:
    """Log the evaluations the MLflow run has no tag for. A record's tag goes in the same
    batch as its metrics (a record's few metrics fit one), so an export cut short leaves the
    record either logged with its tag or not logged at all, and the next export completes
    it."""
    from mlflow.entities import Metric, RunTag

    exported, changed, skipped, points = [], [], [], 0
    for doc in evaluations_of(record):
        key, value = evaluation_tag(doc)
        if key in tags:
            if _tagged_start(tags[key]) != doc.get("started_at"):
                changed.append(doc["record"])  # evaluated again since; MLflow keeps the first
            continue
        found = evaluation_points(doc)
        if found is None:
            skipped.append(doc["record"])
            continue
        try:
            stamp = _millis(str(doc.get("ended_at")))
        except ValueError:
            stamp = _millis(record.result.ended_at)
        metrics = [Metric(k, v, stamp, step) for k, v, step in found]
        client.log_dict(run_id, _redacted({k: v for k, v in doc.items() if k != "record"}),
                        f"{EVALUATION_ARTIFACTS}/{doc['record']}")
        for i in range(0, len(metrics), 999):
            client.log_batch(run_id, metrics=metrics[i:i + 999],
                             tags=[RunTag(key, value)] if i + 999 >= len(metrics) else [])
        if not metrics:
            client.log_batch(run_id, tags=[RunTag(key, value)])
        exported.append(doc["record"])
        points += len(metrics)
    return {"evaluations": exported, "evaluation_metric_points": points,
            "evaluations_changed_since_export": changed, "evaluations_skipped": skipped}
