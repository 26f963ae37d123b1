"""A resumed run's history: what its earlier attempts did up to the checkpoint it continues.

An attempt that resumes from update R did not run updates 1..R; the attempts before it did.
The run is one experiment all the same, so its result reads as one: the metric series
(curves, the first and last values, the validation rows selection ranks) are the earlier
attempts' rows up to R followed by this attempt's own, and the checkpoints selection may
recommend include the ones earlier attempts wrote up to R, each named with its attempt.
Each attempt's series is stored already joined (attempts recorded before joining existed
hold only their own), so one step back is enough for the rows; checkpoints follow the chain
of ``resumed_from`` links, since each attempt hashed only its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.runs.results import Result, SavedCheckpoint, read_series, saved_checkpoints


@dataclass
class History:
    rows: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: dict[int, SavedCheckpoint] = field(default_factory=dict)
    missing: str | None = None  # why the earlier attempts' part is not in this result


def source_attempt(attempts_dir: Path, checkpoint_path: Path) -> int | None:
    """The number of the attempt whose folder holds ``checkpoint_path``."""
    try:
        rel = checkpoint_path.resolve().relative_to(attempts_dir.resolve())
    except ValueError:
        return None
    return int(rel.parts[0]) if rel.parts and rel.parts[0].isdigit() else None


def _result(attempt_dir: Path) -> Result | None:
    try:
        return Result.load(attempt_dir / "result.json")
    except InvalidInput:
        return None


def checkpoints(attempts_dir: Path, result: Result,
                limit: int | None = None) -> dict[int, SavedCheckpoint]:
    """update -> checkpoint of every checkpoint ``result``'s attempt hashed, and of those the
    attempts it continued hashed up to where it continued them (the newer attempt wins)."""
    found: dict[int, SavedCheckpoint] = {}
    current: Result | None = result
    number, seen = result.attempt, set()
    while current is not None and number not in seen:
        seen.add(number)
        for step, saved in saved_checkpoints(number, current.artifacts).items():
            if limit is None or step <= limit:
                found.setdefault(step, saved)
        link = current.resumed_from
        if link is None:
            break
        limit = link.update if limit is None else min(limit, link.update)
        number = link.attempt  # the folder's number, whatever its result says of itself
        current = _result(attempts_dir / str(number))
    return found


def before(attempts_dir: Path, attempt: int, update: int) -> History:
    """What attempt ``attempt`` and the attempts it continued did up to ``update``."""
    attempt_dir = attempts_dir / str(attempt)
    result = _result(attempt_dir)
    if result is None:  # no record of that attempt: nothing of it can be vouched for
        return History(missing=f"attempt {attempt}, which this one continued from update "
                               f"{update}, left no readable result.json: the metrics and "
                               f"checkpoints of updates 1..{update} are not in this result")
    rows = [r for r in read_series(attempt_dir, result.metrics.series)
            if isinstance(r.get("step"), int) and r["step"] <= update]
    return History(rows, checkpoints(attempts_dir, result, update))
