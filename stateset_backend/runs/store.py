"""The run store: ``runs/<run_id>/`` on disk plus a SQLite index for listing and comparing.

Layout::

    runs/index.sqlite                    the index (runs/index.py), rebuilt from the folders
    runs/.quarantined/<run_id>           a note per run under an active quarantine mark
    runs/<run_id>/plan.json              the plan every attempt ran
    runs/<run_id>/attempts/<n>/          the engine's run directory for attempt n
    runs/<run_id>/attempts/<n>/result.json
    runs/<run_id>/attempts/<n>/.running  locked by the local `run` process while it lives
    runs/<run_id>/result.json            the latest attempt's result

Attempt numbers are allocated under a file lock so two retries of one plan never share a
directory; every result file is written atomically; the index is written under a lock of its
own, so concurrent runs of one store each add their rows. Listings, comparisons and prefixes
read the index only, never a run's files: their cost grows with what they show, not with the
store.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import atomic_write_json, read_json
from stateset_backend.runs import index, quarantine
from stateset_backend.runs.evaluations import entry as evaluation_entry
from stateset_backend.runs.evaluations import records as evaluation_records

if TYPE_CHECKING:  # listing runs needs neither the plan nor the result model, nor a lock
    from filelock import FileLock

    from stateset_backend.plan.launch_plan import LaunchPlan
    from stateset_backend.runs.results import Result

DEFAULT_RUNS_DIR = "runs"
# what recording a local attempt needs should its `run` process die first, locked by that
# process while it lives (providers/tether.py, runner.record_abandoned)
RUNNING = ".running"
MIN_DIGEST_PREFIX = 8  # 32 bits: two digests of a store this size do not share one
_HEX = re.compile(r"[0-9a-f]+")


def _lock(path: Path) -> FileLock:
    from filelock import FileLock

    return FileLock(str(path))


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
        without ``sha256:``) names it; an ambiguous one is refused with the candidates. A
        whole run id is looked up in its folder, a prefix in the index."""
        if not target or target.startswith(".") or Path(target).name != target:
            raise InvalidInput(f"{target!r} is not a run id or an experiment digest "
                               "(see `runs list`)")
        if not target.startswith("sha256:") and (self.run_dir(target) / "plan.json").is_file():
            return "run", target
        hex_part = target.removeprefix("sha256:").lower()
        runs: list[str] = []
        count = 0
        if not target.startswith("sha256:"):
            where, args = index.prefix_range("run_id", target)
            count = self._scalar(f"SELECT COUNT(*) FROM runs WHERE {where}", args)
            runs = [row[0] for row in self._select(
                f"SELECT run_id FROM runs WHERE {where} ORDER BY run_id LIMIT 5", args)]
            if count == 1 and not (self.run_dir(runs[0]) / "plan.json").is_file():
                runs, count = [], 0  # removed since it was indexed
        digests = []
        if len(hex_part) >= MIN_DIGEST_PREFIX and _HEX.fullmatch(hex_part):
            where, args = index.prefix_range("experiment_digest", f"sha256:{hex_part}")
            digests = [row[0] for row in self._select(
                f"SELECT DISTINCT experiment_digest FROM attempts WHERE {where} "
                "ORDER BY experiment_digest", args)]
        found: list[tuple[Literal["run", "digest"], str]] = \
            [("run", r) for r in runs] + [("digest", d) for d in digests]
        if count + len(digests) == 1:
            return found[0]
        if not found:
            short = f" (a digest prefix needs {MIN_DIGEST_PREFIX} hex digits)" \
                if _HEX.fullmatch(hex_part) and len(hex_part) < MIN_DIGEST_PREFIX else ""
            raise InvalidInput(f"{target}: no run or experiment digest in {self.root} "
                               f"starts so{short} (see `runs list`)")
        total = count + len(digests)
        raise InvalidInput(f"{target}: ambiguous, {total} match: " + ", ".join(
            name for _, name in found[:5]) + (", ..." if total > 5 else ""))

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
        with _lock(run_dir / ".lock"):
            plan_path = run_dir / "plan.json"
            if plan_path.exists():
                stored = read_json(plan_path, what="plan")
                if stored.get("checksum") != plan.checksum:
                    raise InvalidInput(f"run {plan.run_id} already exists with a different "
                                       "plan; make a new plan instead of reusing its run id")
            else:
                atomic_write_json(plan_path, plan.to_json())
                self._write(lambda conn: index.put_runs(conn, [plan.run_id]))
            attempts = run_dir / "attempts"
            attempts.mkdir(exist_ok=True)
            taken = [int(p.name) for p in attempts.iterdir() if p.name.isdigit()]
            number = max(taken, default=0) + 1
            directory = attempts / str(number)
            directory.mkdir()
        return Attempt(plan.run_id, number, directory)

    def finish(self, attempt: Attempt, result: Result, *, latest_too: bool = True) -> Path:
        """Record an attempt's result; ``latest_too`` False when a newer attempt already has
        its result (an abandoned attempt recorded late), whose run-level copy stays."""
        if result.status == "quarantined":  # the run, not only this attempt, is suspect now
            quarantine.promote(attempt.directory, self.run_dir(attempt.run_id), attempt.number)
        doc = result.to_json()
        atomic_write_json(attempt.directory / "result.json", doc)
        latest = self.run_dir(attempt.run_id) / "result.json"
        if latest_too:
            atomic_write_json(latest, doc)
        row = index.attempt_row(result)
        self._write(lambda conn: index.put_attempts(conn, [row]))
        return latest if latest_too else attempt.directory / "result.json"

    def record_evaluation(self, run_id: str, record: str, doc: dict[str, Any]) -> None:
        """Index an evaluation record just written into the run's folder as ``record``."""
        entry = evaluation_entry({**doc, "record": record})
        self._write(lambda conn: index.put_evaluations(conn, run_id, [entry]))

    # -- the index: written as runs go, read by `runs`, rebuilt from the directories --

    @property
    def index_path(self) -> Path:
        return self.root / "index.sqlite"

    def _write(self, change: Callable[[sqlite3.Connection], None]) -> None:
        """Apply ``change`` to the index under its lock; an index that is missing, damaged or
        of another version is rebuilt whole instead (from the folders, which already hold
        what ``change`` adds)."""
        with _lock(self.root / ".index.lock"):
            try:
                with closing(sqlite3.connect(self.index_path)) as conn:
                    if not index.current(conn):
                        raise sqlite3.DatabaseError("not an index of this version")
                    change(conn)
                    conn.commit()
            except sqlite3.DatabaseError:
                self._rebuild()

    def reindex(self) -> tuple[int, list[str]]:
        """Rebuild the index from the run directories (the source of truth), atomically; the
        count indexed and what could not be read (indexed as ``unreadable``, never dropped)."""
        with _lock(self.root / ".index.lock"):
            return self._rebuild()

    def _repair(self) -> None:
        """Rebuild the index that a reader found unusable, unless another process did so while
        this one waited for the lock."""
        with _lock(self.root / ".index.lock"):
            try:
                with closing(self._connect()) as conn:
                    if index.current(conn):
                        return
            except sqlite3.DatabaseError:
                pass
            self._rebuild()

    def _rebuild(self) -> tuple[int, list[str]]:
        rows, unreadable, runs, evaluations, marked = self._scan()
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".index.", suffix=".sqlite", dir=self.root)
        os.close(fd)
        try:
            Path(tmp).unlink()  # sqlite creates it with the mode of a plain file
            with closing(sqlite3.connect(tmp)) as conn:
                index.create(conn)
                index.put_attempts(conn, rows)
                index.put_runs(conn, runs)
                for run_id, entries in evaluations.items():
                    index.put_evaluations(conn, run_id, entries)
                conn.commit()
            os.replace(tmp, self.index_path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        quarantine.renote(self.root, marked)
        return len(rows), unreadable

    def _scan(self) -> tuple[list[tuple[Any, ...]], list[str], list[str],
                             dict[str, list[dict[str, Any]]], list[str]]:
        """Everything the index holds, read from the folders in one pass: attempt rows (an
        unreadable result as ``unreadable``), the problems, the runs with a plan, evaluation
        entries and the runs under an active quarantine mark."""
        from stateset_backend.runs.results import Result

        rows: list[tuple[Any, ...]] = []
        unreadable, runs, marked = [], [], []
        evaluations: dict[str, list[dict[str, Any]]] = {}
        folders = sorted(e.name for e in os.scandir(self.root) if not e.name.startswith(".")
                         and e.is_dir()) if self.root.is_dir() else []
        for run_id in folders:
            run_dir = self.run_dir(run_id)
            names = set(os.listdir(run_dir))
            if "plan.json" in names:
                runs.append(run_id)
            if quarantine.MARKER in names and quarantine.active(run_dir) is not None:
                marked.append(run_id)
            if "evaluations" in names:
                entries = [evaluation_entry(doc) for doc in evaluation_records(run_dir)]
                if entries:
                    evaluations[run_id] = entries
            numbers = sorted(int(n) for n in os.listdir(run_dir / "attempts")
                             if n.isdigit()) if "attempts" in names else []
            for number in numbers:
                path = run_dir / "attempts" / str(number) / "result.json"
                if not path.is_file():
                    continue  # running, or ended without one
                try:
                    rows.append(index.attempt_row(Result.load(path)))
                except InvalidInput as exc:
                    unreadable.append(exc.message)
                    rows.append(index.unreadable_row(run_id, number, exc.message,
                                                     self._plan_or_none(run_id)))
        return rows, unreadable, runs, evaluations, marked

    def _plan_or_none(self, run_id: str) -> Any:
        try:
            return read_json(self.run_dir(run_id) / "plan.json", what="plan")
        except InvalidInput:
            return None

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"{self.index_path.as_uri()}?mode=ro", uri=True)

    def _select(self, sql: str, args: list[Any]) -> list[tuple[Any, ...]]:
        """Rows of a read-only query of the index; an index that is missing, unreadable or of
        another version is rebuilt from the directories first."""
        if not self.root.is_dir():
            return []
        for tries in range(2):
            try:
                if not self.index_path.is_file():
                    raise sqlite3.DatabaseError("no index")
                with closing(self._connect()) as conn:
                    if not index.current(conn):
                        raise sqlite3.DatabaseError("not an index of this version")
                    return list(conn.execute(sql, args))
            except sqlite3.DatabaseError:
                if tries:
                    raise
                self._repair()
        return []

    def _scalar(self, sql: str, args: list[Any]) -> int:
        rows = self._select(sql, args)
        return int(rows[0][0]) if rows else 0

    def _status(self, row: dict[str, Any], quarantined: set[str]) -> dict[str, Any]:
        """A run under an active quarantine mark lists as quarantined whatever its attempt
        ended as (a restore refused at resume marks the run, not an attempt). Once `runs
        verify` has cleared the mark, an attempt that ended quarantined lists as what it is
        then: failed, with state proven sound to resume from."""
        row["attempt_status"] = row["status"]
        if row["run_id"] in quarantined:
            row["status"] = "quarantined"
        elif row["status"] == "quarantined":
            row["status"] = "failed"
        return row

    def query(self, *, digest: str | None = None, engine: str | None = None,
              status: str | None = None, limit: int | None = None,
              offset: int = 0) -> list[dict[str, Any]]:
        """The latest attempt of each run from the index, newest run first (``limit`` of them
        after ``offset``), with the run's status (``quarantined`` while its mark holds)."""
        return self.page(digest=digest, engine=engine, status=status, limit=limit,
                         offset=offset, count=False)[0]

    def page(self, *, digest: str | None = None, engine: str | None = None,
             status: str | None = None, limit: int | None = None, offset: int = 0,
             count: bool = True) -> tuple[list[dict[str, Any]], int]:
        """``query``'s rows and how many runs match in all (when ``count``; else -1)."""
        marked = quarantine.noted(self.root)
        where, args = index.filters(digest=digest, engine=engine, status=status,
                                    quarantined=marked)
        held = set(marked)
        rows = [self._status(dict(zip(index.COLUMNS, row, strict=True)), held)
                for row in self._select(index.listing(where, limit, offset), args)]
        if not count:
            return rows, -1
        if offset == 0 and (limit is None or len(rows) < limit):
            return rows, len(rows)  # the page holds them all
        return rows, self._scalar(f"SELECT COUNT(*) FROM attempts WHERE {where}", args)

    def run_ids(self, *, digest: str) -> list[str]:
        """The runs whose latest attempt ran this experiment, newest first."""
        return [row[0] for row in self._select(
            "SELECT run_id FROM attempts WHERE experiment_digest = ? AND latest = 1 "
            "ORDER BY run_id DESC", [digest])]

    def attempts(self, run_ids: list[str]) -> list[dict[str, Any]]:
        """Every indexed attempt of these runs, in the order given and by attempt, with its
        ``detail`` (what `runs compare` shows) and its evaluation entries (``test``)."""
        where, args = index.in_runs(run_ids)
        found: dict[str, list[dict[str, Any]]] = {}
        for row in self._select(f"SELECT {', '.join(index.COLUMNS)}, detail FROM attempts "
                                f"WHERE {where} ORDER BY run_id, attempt", args):
            doc = dict(zip(index.COLUMNS, row, strict=False))
            doc["detail"], doc["test"] = index.detail(row[-1]), []
            found.setdefault(doc["run_id"], []).append(doc)
        for run_id, attempt, entry in self._select(
                f"SELECT run_id, attempt, entry FROM evaluations WHERE {where} "
                "ORDER BY run_id, record", args):
            for doc in found.get(run_id, []):
                if doc["attempt"] == attempt:
                    doc["test"].append(json.loads(entry))
        return [doc for run_id in run_ids for doc in found.get(run_id, [])]
