"""Export one attempt to an MLflow tracking store, so runs can sit next to the rest of a team's
experiments: the spec's fields as params, the canonical metrics with their steps, the identity
as tags and the artifact manifest (path, sha256, bytes) as a JSON artifact.

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
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .. import __version__
from .errors import InvalidInput, Unsupported
from .jsonio import flatten
from .report import AttemptRecord, read_series

MANIFEST_ARTIFACT = "stateset/artifacts.json"
TAG = "stateset."
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
           "interrupted": "KILLED"}


def redact(text: str) -> str:
    """A URL's password and secret-looking query values replaced by ``***``."""
    return _SECRET_QUERY.sub(lambda m: m.group(1) + REDACTED,
                             _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text))


def _value(key: str, value: Any) -> str:
    if any(_SECRET_KEY.search(part) for part in key.split(".")):
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


def _millis(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


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
    and logs nothing twice."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no usage reports from here
    try:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise Unsupported("exporting to MLflow needs mlflow: pip install "
                          "'stateset-backend[mlflow]'") from None
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    r = record.result
    spec_name = (record.plan.get("spec") or {}).get("name") or "experiment"
    experiment_name = experiment_name or f"{spec_name} {r.experiment_digest[:19]}"
    shown_uri = redact(tracking_uri)
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
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
            return {"tracking_uri": shown_uri, "experiment_id": experiment_id,
                    "mlflow_run_id": found[0].info.run_id, "already_exported": True}
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
        client.set_terminated(run_id, status=_STATUS.get(r.status, "FAILED"),
                              end_time=_millis(r.ended_at))
    except MlflowException as exc:
        raise InvalidInput(f"MLflow store {shown_uri}: {redact(str(exc).splitlines()[0])}") \
            from None
    return {"tracking_uri": shown_uri, "experiment_id": experiment_id,
            "experiment_name": experiment_name, "mlflow_run_id": run_id,
            "already_exported": False, "params": len(params), "metric_points": len(metrics),
            "metrics": sorted({m.key for m in metrics}),
            "artifacts_listed": len(r.artifacts), "manifest": MANIFEST_ARTIFACT}
