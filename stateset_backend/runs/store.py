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

import glob
import os
import re
import sqlite3
import tempfile
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from filelock import FileLock

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import atomic_write_json, read_json
from stateset_backend.runs import quarantine
from stateset_backend.runs.results import Result

if TYPE_CHECKING:  # listing runs needs no plan model
    from stateset_backend.plan.launch_plan import LaunchPlan

DEFAULT_RUNS_DIR = "runs"
MIN_DIGEST_PREFIX = 8  # 32 bits: two digests of a store this size do not share one
_HEX = re.compile(r"[0-9a-f]+")


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

    def resolve(self, target: str) -> tuple[Literal["run", "digest"], str]:
        """What a user typed for a run or an experiment: ("run", id) or ("digest", digest).
        Listings shorten both, so a unique prefix of a run id or of a digest (with or
        without ``sha256:``) names it; an ambiguous one is refused with the candidates."""
        if not target or target.startswith(".") or Path(target).name != target:
            raise InvalidInput(f"{target!r} is not a run id or an experiment digest "
                               "(see `runs list`)")
        if not target.startswith("sha256:") and (self.run_dir(target) / "plan.json").is_file():
            return "run", target
        hex_part = target.removeprefix("sha256:").lower()
        runs = [] if target.startswith("sha256:") else \
            sorted(p.name for p in self.root.glob(f"{glob.escape(target)}*")
                   if (p / "plan.json").is_file()) if self.root.is_dir() else []
        digests = [row[0] for row in self._select(
            "SELECT DISTINCT experiment_digest FROM attempts WHERE experiment_digest LIKE ? "
            "ORDER BY experiment_digest", [f"sha256:{hex_part}%"])] \
            if len(hex_part) >= MIN_DIGEST_PREFIX and _HEX.fullmatch(hex_part) else []
        found: list[tuple[Literal["run", "digest"], str]] = \
            [("run", r) for r in runs] + [("digest", d) for d in digests]
        if len(found) == 1:
            return found[0]
        if not found:
            short = f" (a digest prefix needs {MIN_DIGEST_PREFIX} hex digits)" \
                if _HEX.fullmatch(hex_part) and len(hex_part) < MIN_DIGEST_PREFIX else ""
            raise InvalidInput(f"{target}: no run or experiment digest in {self.root} "
                               f"starts so{short} (see `runs list`)")
        raise InvalidInput(f"{target}: ambiguous, {len(found)} match: " + ", ".join(
            name for _, name in found[:5]) + (", ..." if len(found) > 5 else ""))

    def resolve_run(self, target: str) -> str:
        kind, name = self.resolve(target)
        if kind != "run":
            raise InvalidInput(f"{target}: names experiment {name}, not one run; pick a run "
                               f"with `runs list --digest {name}`")
        return name

    def resolve_digest(self, target: str) -> str:
        kind, name = self.resolve(target)
        if kind != "digest":
            raise InvalidInput(f"{target}: names run {name}, not an experiment digest")
        return name

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

    def _insert(self, db: Path, results: list[Result],
                extra: list[tuple[object, ...]] | None = None) -> None:
        with closing(sqlite3.connect(db)) as conn:
            conn.execute(self._SCHEMA)
            conn.executemany(f"INSERT OR REPLACE INTO attempts VALUES "
                             f"({','.join('?' * len(self._COLUMNS))})",
                             [self._row(r) for r in results] + (extra or []))
            conn.commit()

    def results(self) -> tuple[list[Result], list[tuple[str, int, str]]]:
        """Every attempt's result.json under the store, oldest run first, and (run id,
        attempt, problem) for each one that cannot be read."""
        found, unreadable = [], []
        for path in sorted(self.root.glob("*/attempts/*/result.json")):
            if not path.parent.name.isdigit():
                continue
            try:
                found.append(Result.load(path))
            except InvalidInput as exc:
                unreadable.append((path.parent.parent.parent.name, int(path.parent.name),
                                   exc.message))
        return found, unreadable

    def reindex(self) -> tuple[int, list[str]]:
        """Rebuild the index from the run directories (the source of truth), atomically; the
        count indexed and what could not be read (indexed as ``unreadable``, never dropped)."""
        with FileLock(str(self.root / ".index.lock")):
            return self._rebuild()

    def _rebuild(self) -> tuple[int, list[str]]:
        results, unreadable = self.results()
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".index.", suffix=".sqlite", dir=self.root)
        os.close(fd)
        try:
            Path(tmp).unlink()
            self._insert(Path(tmp), results, [self._unreadable_row(*u) for u in unreadable])
            os.replace(tmp, self.index_path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return len(results) + len(unreadable), [why for _, _, why in unreadable]

    def _unreadable_row(self, run_id: str, attempt: int, why: str) -> tuple[object, ...]:
        """An attempt whose result cannot be read still shows, as ``unreadable``, with what
        its run's plan says (a newer attempt that vanished from listings would let an older
        one pass for the run's outcome)."""
        try:
            plan = read_json(self.run_dir(run_id) / "plan.json", what="plan")
        except InvalidInput:
            plan = {}
        plan = plan if isinstance(plan, dict) else {}

        def text(key: str, missing: str) -> str:
            value = plan.get(key)
            return value if isinstance(value, str) else missing

        spec = plan.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        budget = spec.get("budget")
        budget = budget if isinstance(budget, dict) else {}
        planned = budget.get("total_updates")
        return (run_id, attempt, text("experiment_digest", ""), text("binding_digest", ""),
                text("checksum", ""), text("engine", "?"), text("engine_version", "?"),
                "unreadable", None, 0, planned if isinstance(planned, int) else 0, "", "", 0)

    def _run_status(self, row: dict[str, Any]) -> dict[str, Any]:
        """A run under an active quarantine mark lists as quarantined whatever its attempt
        ended as (a restore refused at resume marks the run, not an attempt). Once `runs
        verify` has cleared the mark, an attempt that ended quarantined lists as what it is
        then: failed, with state proven sound to resume from."""
        row["attempt_status"] = row["status"]
        if quarantine.active(self.run_dir(row["run_id"])) is not None:
            row["status"] = "quarantined"
        elif row["status"] == "quarantined":
            row["status"] = "failed"
        return row

    def query(self, *, digest: str | None = None, engine: str | None = None,
              status: str | None = None, latest_only: bool = True) -> list[dict[str, Any]]:
        """Attempts from the index (the latest attempt of each run unless asked otherwise),
        newest first, with the run's status (``quarantined`` while its mark holds)."""
        where, args = [], []
        for column, value in (("experiment_digest", digest), ("engine", engine)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if latest_only:
            where.append("attempt = (SELECT MAX(b.attempt) FROM attempts b "
                         "WHERE b.run_id = attempts.run_id)")
        sql = (f"SELECT {', '.join(self._COLUMNS)} FROM attempts" +
               (f" WHERE {' AND '.join(where)}" if where else "") +
               " ORDER BY run_id DESC, attempt DESC")
        rows = [self._run_status(dict(zip(self._COLUMNS, row, strict=True)))
                for row in self._select(sql, args)]
        return [r for r in rows if status is None or r["status"] == status]

    def _select(self, sql: str, args: list[Any]) -> list[tuple[Any, ...]]:
        """Rows of a read-only query of the index; a missing or unreadable index is rebuilt
        from the directories first."""
        if not self.root.is_dir():
            return []
        for tries in range(2):
            try:
                if not self.index_path.is_file():
                    raise sqlite3.DatabaseError("no index")
                with closing(sqlite3.connect(
                        f"{self.index_path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
                    return list(conn.execute(sql, args))
            except sqlite3.DatabaseError:
                if tries:
                    raise
                self.reindex()
        return []
