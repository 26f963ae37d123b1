"""Quarantine: a run whose state may be half-changed is not trusted again until it is proven.

A learner update that failed after some parameters had already stepped, a checkpoint write
that failed, or a restore that failed leaves a run whose newest state nobody can vouch for.
The engine writes a marker into its attempt directory the moment that happens; the store
copies it to the run directory when the attempt ends. While the run's marker is active,
``run --resume`` and ``evaluate`` refuse it (exit 6) until ``runs verify`` has reloaded a
checkpoint whose manifest hashes check into a fresh model and cleared the mark. Clearing keeps
the document (with what cleared it), so ``runs show`` can still tell the story.

The run store keeps a note per run under an active mark (``<runs>/.quarantined/<run_id>``,
empty), written with the run's own marker, so that `runs list` finds the quarantined runs of a
store of any size without opening each run's folder; `runs reindex` rewrites the notes from the
markers.

Torch-free: the engine, the store and the CLI all read and write the same small JSON file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from stateset_backend.common.errors import InvalidInput, ResumeImpossible
from stateset_backend.common.jsonio import atomic_write_json, read_json, utc_now

MARKER = "quarantine.json"
Fault = Literal["learner_update", "checkpoint_write", "restore"]
FAULTS: tuple[str, ...] = ("learner_update", "checkpoint_write", "restore")
NOTES = ".quarantined"  # in the run store, beside the run folders


def mark(directory: Path, *, fault: Fault, reason: str, update: int | None = None,
         attempt: int | None = None) -> dict[str, Any]:
    """Write the marker into ``directory`` (an attempt's or a run's), atomically."""
    if fault not in FAULTS:
        raise ValueError(f"unknown quarantine fault {fault!r}")
    doc: dict[str, Any] = {"quarantined": True, "fault": fault, "reason": reason,
                           "update": update, "attempt": attempt, "marked_at": utc_now()}
    atomic_write_json(directory / MARKER, doc)
    _note(directory, True)
    return doc


def _note(directory: Path, held: bool) -> None:
    """Keep the store's note of a run in step with its marker. Only a run's marker has one
    (its folder holds the plan); an attempt's is copied onto its run when the attempt ends."""
    if not (directory / "plan.json").is_file():
        return
    note = directory.parent / NOTES / directory.name
    if held:
        note.parent.mkdir(exist_ok=True)
        note.touch()
    else:
        note.unlink(missing_ok=True)


def noted(root: Path) -> list[str]:
    """The runs of the store at ``root`` under an active mark, as the notes say (one listing of
    one folder, whatever the size of the store); sorted."""
    try:
        names = os.listdir(root / NOTES)
    except OSError:
        return []
    return sorted(n for n in names if not n.startswith("."))


def renote(root: Path, marked: list[str]) -> None:
    """Make the store's notes name exactly ``marked``, the runs whose marker is active."""
    notes = root / NOTES
    keep = set(marked)
    for name in os.listdir(notes) if notes.is_dir() else []:
        if name not in keep:
            (notes / name).unlink(missing_ok=True)
    if keep:
        notes.mkdir(exist_ok=True)
    for name in keep:
        (notes / name).touch()


def read(directory: Path) -> dict[str, Any] | None:
    """The marker document in ``directory`` (active or cleared), or None. An unreadable marker
    is itself a reason to distrust the run, so it reads as active."""
    path = directory / MARKER
    if not path.exists():
        return None
    try:
        doc = read_json(path, what="quarantine marker")
    except InvalidInput as exc:
        return {"quarantined": True, "fault": "unknown", "reason": exc.message}
    if not isinstance(doc, dict):
        return {"quarantined": True, "fault": "unknown", "reason": f"{path}: not an object"}
    return doc


def active(run_dir: Path) -> dict[str, Any] | None:
    """The run's marker when it still holds."""
    doc = read(run_dir)
    return doc if doc is not None and doc.get("quarantined", True) else None


def promote(attempt_dir: Path, run_dir: Path, attempt: int) -> dict[str, Any] | None:
    """Copy an attempt's marker onto its run (the run is what resume and evaluate look at)."""
    doc = read(attempt_dir)
    if doc is None:
        return None
    doc = {**doc, "quarantined": True, "attempt": attempt}
    atomic_write_json(run_dir / MARKER, doc)
    _note(run_dir, True)
    return doc


def describe(doc: dict[str, Any]) -> str:
    where = f" at update {doc['update']}" if doc.get("update") is not None else ""
    attempt = f" (attempt {doc['attempt']})" if doc.get("attempt") is not None else ""
    return f"{doc.get('fault', 'unknown').replace('_', ' ')} failed{where}{attempt}: " \
           f"{doc.get('reason', '')}"


def refuse_if_quarantined(run_dir: Path, run_id: str, action: str) -> None:
    """Exit 6 naming the fault while the run's marker is active."""
    doc = active(run_dir)
    if doc is not None:
        raise ResumeImpossible(f"run {run_id} is quarantined ({describe(doc)}); cannot "
                               f"{action} until `stateset-backend runs verify {run_id}` "
                               "reloads a verified checkpoint", details=doc)


def clear(run_dir: Path, verified: dict[str, Any]) -> dict[str, Any]:
    """Lift the mark after a verified full reload; the document keeps the history."""
    doc = read(run_dir) or {}
    cleared = {**doc, "quarantined": False, "cleared_at": utc_now(), "cleared_by": verified}
    atomic_write_json(run_dir / MARKER, cleared)
    _note(run_dir, False)
    return cleared
