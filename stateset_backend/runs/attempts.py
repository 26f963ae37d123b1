"""One attempt of a run read back from the store, as every view of a finished run needs it: the
report, the MLflow export, the attestation and held-out evaluation all describe the same
attempt, so they load it, its series and its evaluation records the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import read_json
from stateset_backend.runs import results
from stateset_backend.runs.evaluations import EVALUATION_DIR
from stateset_backend.runs.results import Result
from stateset_backend.runs.store import RunStore


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as the store keeps it: the plan every attempt ran, this attempt's result
    and its directory (where the series, artifacts and evaluation records live)."""

    plan: dict[str, Any]
    result: Result
    directory: Path

    @property
    def run_id(self) -> str:
        return self.result.run_id


def _run_dir(store: RunStore, run_id: str) -> Path:
    if not run_id or run_id.startswith(".") or Path(run_id).name != run_id:
        raise InvalidInput(f"{run_id!r} is not a run id (see `runs list`)")
    run_dir = store.run_dir(run_id)
    if not (run_dir / "plan.json").is_file():
        raise InvalidInput(f"run {run_id}: not in {store.root} (see `runs list`)")
    return run_dir


def load_attempt(store: RunStore, run_id: str, attempt: int | None = None) -> AttemptRecord:
    """The named attempt of a run, or its newest attempt that has a readable result."""
    run_dir = _run_dir(store, run_id)
    plan = read_json(run_dir / "plan.json", what="plan")
    folders = sorted((p for p in (run_dir / "attempts").glob("*") if p.name.isdigit()),
                     key=lambda p: int(p.name), reverse=True)
    if attempt is not None:
        folders = [f for f in folders if int(f.name) == attempt]
        if not folders:
            raise InvalidInput(f"run {run_id} has no attempt {attempt}")
    problems = []
    for folder in folders:
        path = folder / "result.json"
        if not path.is_file():
            problems.append(f"attempt {folder.name}: no result.json")
            continue
        try:
            result = Result.load(path)
        except InvalidInput as exc:
            problems.append(f"attempt {folder.name}: unreadable result.json ({exc.message})")
            continue
        return AttemptRecord(plan, result, folder)
    raise InvalidInput(f"run {run_id} has no attempt with a result"
                       + (f": {'; '.join(problems)}" if problems else ""))


def load_target(store: RunStore, kind: str, name: str,
                ) -> tuple[list[AttemptRecord], list[str]]:
    """A run (``kind`` "run"): its newest attempt. An experiment digest: the newest attempt of
    every run of it, oldest run first (the order the page lists them in), and why any run of
    it could not be read: one damaged run leaves the others' page standing, and the page says
    what it left out. ``RunStore.resolve`` names what a user typed."""
    if kind == "run":
        return [load_attempt(store, name)], []
    records, skipped = [], []
    for run_id in sorted(dict.fromkeys(r["run_id"] for r in store.query(digest=name))):
        try:
            records.append(load_attempt(store, run_id))
        except InvalidInput as exc:
            skipped.append(f"run {run_id}: {exc.message}")
    if not records:
        raise InvalidInput(f"no readable run of experiment {name} in {store.root}"
                           + (f": {'; '.join(skipped[:3])}" if skipped else ""))
    return records, skipped


def read_series(record: AttemptRecord) -> list[dict[str, Any]]:
    """The canonical per-update metrics of an attempt (empty when it reported none)."""
    return results.read_series(record.directory, record.result.metrics.series)


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        math.isfinite(value)


def evaluation_records(record: AttemptRecord) -> list[tuple[str, dict[str, Any]]]:
    """Held-out evaluation records (``evaluations/*.json``) of the attempt and of its run,
    kept apart from the training metrics; (file name, document) pairs."""
    found = []
    for folder in (record.directory / EVALUATION_DIR,
                   record.directory.parent.parent / EVALUATION_DIR):
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                doc = read_json(path, what="evaluation record")
            except InvalidInput:
                continue
            if isinstance(doc, dict) and doc.get("attempt", record.result.attempt) in (
                    record.result.attempt, None):
                found.append((path.name, doc))
    return found
