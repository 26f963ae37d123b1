"""The run store's index: one SQLite file that answers `runs list`, `runs compare` and the
prefixes users type without opening any run's files.

The run directories are the source of truth; the index is what they say, kept in step as each
attempt begins and ends and each evaluation is recorded, and rebuilt whole from them when it is
missing, damaged or of another ``VERSION`` (``PRAGMA user_version``). Its tables:

- ``attempts``: one row per attempt's result (``unreadable`` when it cannot be read), ``latest``
  set on each run's newest attempt, ``detail`` the JSON of what `runs compare` shows of it;
- ``runs``: every run folder with a plan, written when its first attempt begins, so that a
  prefix names a run before it has a result;
- ``evaluations``: the held-out evaluation records `evaluate` wrote, as the views show them;
- ``in_flight``: attempts whose job a cluster accepted and that have no result yet (provider
  and job id), so that `runs list` shows them, asking the provider for their state, without
  opening a folder; an attempt's row goes when its result is indexed.

A run id begins with the UTC time its plan was made (``20260101T000000Z-1a2b3c4d``), so the
primary key's order is the creation order: the newest page of a listing reads the last entries
of an index; the filters (digest, engine, status) each have an index ending in the same order.
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the readers never load the result model
    from stateset_backend.runs.results import Result

VERSION = 3
COLUMNS = ("run_id", "attempt", "experiment_digest", "binding_digest", "plan_checksum",
           "engine", "engine_version", "status", "exit_code", "committed_updates",
           "planned_updates", "started_at", "ended_at", "deviations")
SCHEMA = (
    "CREATE TABLE attempts (run_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
    "experiment_digest TEXT, binding_digest TEXT, plan_checksum TEXT, engine TEXT, "
    "engine_version TEXT, status TEXT, exit_code INTEGER, committed_updates INTEGER, "
    "planned_updates INTEGER, started_at TEXT, ended_at TEXT, deviations INTEGER, "
    "latest INTEGER NOT NULL DEFAULT 0, detail TEXT, PRIMARY KEY (run_id, attempt))",
    "CREATE INDEX attempts_latest ON attempts (latest, run_id)",
    "CREATE INDEX attempts_digest ON attempts (experiment_digest, latest, run_id)",
    "CREATE INDEX attempts_engine ON attempts (engine, latest, run_id)",
    "CREATE INDEX attempts_status ON attempts (status, latest, run_id)",
    "CREATE TABLE runs (run_id TEXT PRIMARY KEY) WITHOUT ROWID",
    "CREATE TABLE evaluations (run_id TEXT NOT NULL, record TEXT NOT NULL, attempt INTEGER, "
    "entry TEXT NOT NULL, PRIMARY KEY (run_id, record))",
    "CREATE TABLE in_flight (run_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
    "provider TEXT NOT NULL, job TEXT NOT NULL, PRIMARY KEY (run_id, attempt))",
    f"PRAGMA user_version = {VERSION}",
)
IN_FLIGHT = ("SELECT run_id, attempt, provider, job FROM in_flight "
             "ORDER BY run_id DESC, attempt DESC")
STATUSES = ("succeeded", "failed", "invalid", "interrupted", "quarantined", "prepared",
            "unreadable")
# a set of run ids passed as one JSON parameter (no limit on how many)
_IN_SET = "run_id IN (SELECT value FROM json_each(?))"


def create(conn: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        conn.execute(statement)


def current(conn: sqlite3.Connection) -> bool:
    """Whether ``conn`` holds an index of this version (an empty or foreign file does not)."""
    return bool(conn.execute("PRAGMA user_version").fetchone()[0] == VERSION)


def attempt_row(result: Result) -> tuple[Any, ...]:
    from stateset_backend.runs.results import HEADLINE_METRICS, failure_reason

    summary = result.metrics.summary
    detail = {"final": {k: summary.get(k) for k in HEADLINE_METRICS if k in summary},
              "recommended": result.selection,
              "deviations": [d.get("deviation") for d in result.deviations],
              "reason": failure_reason(result)}
    return (result.run_id, result.attempt, result.experiment_digest, result.binding_digest,
            result.plan_checksum, result.engine, result.engine_version, result.status,
            result.exit_code, result.committed_updates, result.planned_updates,
            result.started_at, result.ended_at, len(result.deviations), json.dumps(detail))


def unreadable_row(run_id: str, attempt: int, why: str, plan: Any) -> tuple[Any, ...]:
    """An attempt whose result cannot be read, with what its run's plan says (a newer attempt
    that vanished from listings would let an older one pass for the run's outcome)."""
    plan = plan if isinstance(plan, dict) else {}

    def text(key: str, missing: str) -> str:
        value = plan.get(key)
        return value if isinstance(value, str) else missing

    spec = plan.get("spec")
    budget = spec.get("budget") if isinstance(spec, dict) else None
    planned = budget.get("total_updates") if isinstance(budget, dict) else None
    return (run_id, attempt, text("experiment_digest", ""), text("binding_digest", ""),
            text("checksum", ""), text("engine", "?"), text("engine_version", "?"),
            "unreadable", None, 0, planned if isinstance(planned, int) else 0, "", "", 0,
            json.dumps({"reason": f"unreadable result.json: {why}"}))


def put_attempts(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Add or replace attempts, then mark the newest attempt of each run they belong to."""
    columns = (*COLUMNS, "detail")
    conn.executemany(f"INSERT OR REPLACE INTO attempts ({', '.join(columns)}) VALUES "
                     f"({', '.join('?' * len(columns))})", rows)
    runs = json.dumps(sorted({row[0] for row in rows}))
    conn.execute("UPDATE attempts SET latest = (attempt = (SELECT MAX(b.attempt) FROM "
                 f"attempts b WHERE b.run_id = attempts.run_id)) WHERE {_IN_SET}", [runs])
    put_runs(conn, [row[0] for row in rows])
    conn.executemany("DELETE FROM in_flight WHERE run_id = ? AND attempt = ?",
                     [(row[0], row[1]) for row in rows])


def put_in_flight(conn: sqlite3.Connection, run_id: str, attempt: int, provider: str,
                  job: str) -> None:
    conn.execute("INSERT OR REPLACE INTO in_flight VALUES (?, ?, ?, ?)",
                 (run_id, attempt, provider, job))


def put_runs(conn: sqlite3.Connection, run_ids: list[str]) -> None:
    conn.executemany("INSERT OR IGNORE INTO runs VALUES (?)", [(r,) for r in run_ids])


def put_evaluations(conn: sqlite3.Connection, run_id: str,
                    entries: list[dict[str, Any]]) -> None:
    """Evaluation records of a run, as ``evaluations.entry`` shapes them."""
    conn.executemany("INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?)",
                     [(run_id, e["record"], e.get("attempt"), json.dumps(e)) for e in entries])


def filters(*, digest: str | None, engine: str | None, status: str | None,
            quarantined: list[str]) -> tuple[str, list[Any]]:
    """The WHERE clause selecting each run's newest attempt with these values. A run under an
    active quarantine mark (``quarantined``) has the status ``quarantined`` whatever its
    attempt ended as; an attempt that ended quarantined on a run cleared since is ``failed``."""
    where, args = ["latest = 1"], []
    for column, value in (("experiment_digest", digest), ("engine", engine)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if status == "quarantined":
        where.append(_IN_SET)
    elif status is not None:
        where.append("status IN (?, ?)" if status == "failed" else "status = ?")
        args += ["failed", "quarantined"] if status == "failed" else [status]
        where.append(f"NOT {_IN_SET}")
    if status is not None:
        args.append(json.dumps(quarantined))
    return " AND ".join(where), args


def listing(where: str, limit: int | None, offset: int) -> str:
    return (f"SELECT {', '.join(COLUMNS)} FROM attempts WHERE {where} ORDER BY run_id DESC "
            f"LIMIT {-1 if limit is None else int(limit)} OFFSET {int(offset)}")


def prefix_range(column: str, prefix: str) -> tuple[str, list[str]]:
    """Values of ``column`` that start with ``prefix``, as a range its index answers (LIKE
    folds case and would read every row)."""
    if not prefix:
        return "1", []
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1) if ord(prefix[-1]) < 0x10FFFF else None
    if upper is None:
        return f"{column} >= ?", [prefix]
    return f"{column} >= ? AND {column} < ?", [prefix, upper]


def in_runs(run_ids: list[str]) -> tuple[str, list[str]]:
    return _IN_SET, [json.dumps(run_ids)]


def detail(text: str | None) -> dict[str, Any]:
    """What `runs compare` shows of an indexed attempt."""
    doc = json.loads(text) if text else {}
    return doc if isinstance(doc, dict) else {}
