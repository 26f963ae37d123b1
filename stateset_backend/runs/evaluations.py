"""Where held-out evaluation records live and how they are read back.

`evaluate` writes them (runs.evaluate, which needs the engine's adapter); `runs show`,
`runs compare`, `report` and the MLflow export only read them, and must not pay for the
adapter machinery to do so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import read_json

EVALUATION_DIR = "evaluations"
EVALUATION_SCHEMA_ID = "stateset-backend/evaluation/v1"


def records(run_dir: Path) -> list[dict[str, Any]]:
    """Every evaluation record of a run (unreadable ones are skipped), oldest name first."""
    folder = run_dir / EVALUATION_DIR
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = read_json(path, what="evaluation record")
        except InvalidInput:
            continue
        if isinstance(doc, dict) and doc.get("schema") == EVALUATION_SCHEMA_ID:
            found.append({**doc, "record": path.name})
    return found


def entry(doc: dict[str, Any]) -> dict[str, Any]:
    """The parts of an evaluation record (read by ``records``) that listings show."""
    checkpoint = doc.get("checkpoint")
    checkpoint = checkpoint if isinstance(checkpoint, dict) else {}
    metrics = doc.get("metrics")
    return {"record": doc.get("record"), "attempt": doc.get("attempt"),
            "split": doc.get("split"), "checkpoint": checkpoint.get("requested"),
            "update": checkpoint.get("update"),
            "metrics": metrics if isinstance(metrics, dict) else {}}
