"""The run store: ``runs/<run_id>/`` on disk plus a SQLite index for listing and comparing.

Layout::

    runs/index.sqlite
    runs/<run_id>/plan.json              the plan every attempt ran
    runs/<run_id>/attempts/<n>/          the engine's run directory for attempt n
    runs/<run_id>/attempts/<n>/result.json
    runs/<run_id>/result.json            the latest attempt's result

Attempt numbers are allocated under a file lock so two retries of one plan never share a
directory; every result file is written atomically.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from .errors import InvalidInput
from .jsonio import atomic_write_json, read_json
from .plan import LaunchPlan
from .results import Result

DEFAULT_RUNS_DIR = "runs"


def runs_dir_from(option: str | None) -> Path:
    return Path(option or os.environ.get("STATESET_BACKEND_RUNS_DIR") or DEFAULT_RUNS_DIR)


@dataclass(frozen=True)
class Attempt:
    run_id: str
    number: int
    directory: Path


class RunStore:
    def __init__(self, root: Path) -> None:
        for parent in (root, *root.parents):
            if parent.exists() and not parent.is_dir():
                raise InvalidInput(f"--runs-dir {root}: {parent} exists and is not a directory")
        self.root = root

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def begin_attempt(self, plan: LaunchPlan) -> Attempt:
        """Record the plan (or prove it is the same one) and allocate the next attempt."""
        run_dir = self.run_dir(plan.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(run_dir / ".lock")):
            plan_path = run_dir / "plan.json"
            if plan_path.exists():
                stored = read_json(plan_path, what="plan")
                if stored.get("checksum") != plan.checksum:
                    raise InvalidInput(f"run {plan.run_id} already exists with a different "
                                       "plan; make a new plan instead of reusing its run id")
            else:
                atomic_write_json(plan_path, plan.to_json())
            attempts = run_dir / "attempts"
            attempts.mkdir(exist_ok=True)
            taken = [int(p.name) for p in attempts.iterdir() if p.name.isdigit()]
            number = max(taken, default=0) + 1
            directory = attempts / str(number)
            directory.mkdir()
        return Attempt(plan.run_id, number, directory)

    def finish(self, attempt: Attempt, result: Result) -> Path:
        doc = result.to_json()
        atomic_write_json(attempt.directory / "result.json", doc)
        latest = self.run_dir(attempt.run_id) / "result.json"
        atomic_write_json(latest, doc)
        self._index(result)
        return latest

    def _index(self, result: Result) -> None:
        db = self.root / "index.sqlite"
        with FileLock(str(self.root / ".index.lock")), closing(sqlite3.connect(db)) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS attempts (run_id TEXT, attempt INTEGER, "
                "experiment_digest TEXT, binding_digest TEXT, plan_checksum TEXT, engine TEXT, "
                "engine_version TEXT, status TEXT, exit_code INTEGER, committed_updates "
                "INTEGER, started_at TEXT, ended_at TEXT, PRIMARY KEY (run_id, attempt))")
            conn.execute(
                "INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (result.run_id, result.attempt, result.experiment_digest,
                 result.binding_digest, result.plan_checksum, result.engine,
                 result.engine_version, result.status, result.exit_code,
                 result.committed_updates, result.started_at, result.ended_at))
            conn.commit()
