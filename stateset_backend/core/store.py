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
import tempfile
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from . import quarantine
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
        # absolute: engines run in their attempt folder, where a relative path to an earlier
        # attempt's checkpoint would name nothing
        self.root = root.resolve()

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
        if result.status == "quarantined":  # the run, not only this attempt, is suspect now
            quarantine.promote(attempt.directory, self.run_dir(attempt.run_id), attempt.number)
        doc = result.to_json()
        atomic_write_json(attempt.directory / "result.json", doc)
        latest = self.run_dir(attempt.run_id) / "result.json"
        atomic_write_json(latest, doc)
        self._index(result)
        return latest

    # -- the index: written on every result, read by `runs`, rebuilt from the directories --
    _SCHEMA = ("CREATE TABLE IF NOT EXISTS attempts (run_id TEXT, attempt INTEGER, "
               "experiment_digest TEXT, binding_digest TEXT, plan_checksum TEXT, engine TEXT, "
               "engine_version TEXT, status TEXT, exit_code INTEGER, committed_updates "
               "INTEGER, planned_updates INTEGER, started_at TEXT, ended_at TEXT, "
               "deviations INTEGER, PRIMARY KEY (run_id, attempt))")
    _COLUMNS = ("run_id", "attempt", "experiment_digest", "binding_digest", "plan_checksum",
                "engine", "engine_version", "status", "exit_code", "committed_updates",
                "planned_updates", "started_at", "ended_at", "deviations")

    @property
    def index_path(self) -> Path:
        return self.root / "index.sqlite"

    @staticmethod
    def _row(result: Result) -> tuple[object, ...]:
        return (result.run_id, result.attempt, result.experiment_digest,
                result.binding_digest, result.plan_checksum, result.engine,
                result.engine_version, result.status, result.exit_code,
                result.committed_updates, result.planned_updates, result.started_at,
                result.ended_at, len(result.deviations))

    def _index(self, result: Result) -> None:
        with FileLock(str(self.root / ".index.lock")):
            try:
                self._insert(self.index_path, [result])
            except sqlite3.DatabaseError:  # an older or damaged index: rebuild it whole
                self._rebuild()

    def _insert(self, db: Path, results: list[Result]) -> None:
        with closing(sqlite3.connect(db)) as conn:
            conn.execute(self._SCHEMA)
            conn.executemany(f"INSERT OR REPLACE INTO attempts VALUES "
                             f"({','.join('?' * len(self._COLUMNS))})",
                             [self._row(r) for r in results])
            conn.commit()

    def results(self) -> list[Result]:
        """Every attempt's result.json under the store, oldest run first."""
        found = []
        for path in sorted(self.root.glob("*/attempts/*/result.json")):
            try:
                found.append(Result.model_validate(read_json(path, what="result")))
            except (InvalidInput, ValueError):
                continue  # a damaged result is not indexed; `runs show` names it
        return found

    def reindex(self) -> int:
        """Rebuild the index from the run directories (the source of truth); atomic."""
        with FileLock(str(self.root / ".index.lock")):
            return self._rebuild()

    def _rebuild(self) -> int:
        results = self.results()
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".index.", suffix=".sqlite", dir=self.root)
        os.close(fd)
        try:
            Path(tmp).unlink()
            self._insert(Path(tmp), results)
            os.replace(tmp, self.index_path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return len(results)

    def query(self, *, digest: str | None = None, engine: str | None = None,
              status: str | None = None, latest_only: bool = True) -> list[dict[str, Any]]:
        """Attempts from the index (the latest attempt of each run unless asked otherwise),
        newest first. A missing or unreadable index is rebuilt from the directories first."""
        if not self.root.is_dir():
            return []
        for tries in range(2):
            try:
                if not self.index_path.is_file():
                    raise sqlite3.DatabaseError("no index")
                with closing(sqlite3.connect(
                        f"{self.index_path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
                    where, args = [], []
                    for column, value in (("experiment_digest", digest), ("engine", engine),
                                          ("status", status)):
                        if value is not None:
                            where.append(f"{column} = ?")
                            args.append(value)
                    if latest_only:
                        where.append("attempt = (SELECT MAX(b.attempt) FROM attempts b "
                                     "WHERE b.run_id = attempts.run_id)")
                    sql = (f"SELECT {', '.join(self._COLUMNS)} FROM attempts" +
                           (f" WHERE {' AND '.join(where)}" if where else "") +
                           " ORDER BY run_id DESC, attempt DESC")
                    return [dict(zip(self._COLUMNS, row, strict=True))
                            for row in conn.execute(sql, args)]
            except sqlite3.DatabaseError:
                if tries:
                    raise
                self.reindex()
        return []
