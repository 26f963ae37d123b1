"""`runs verify RUN`: prove a run's newest sound checkpoint reloads whole, and only then lift
its quarantine.

Checkpoints are tried newest first, across attempts: each one's manifest hashes are checked,
then the engine's adapter loads it completely into a fresh model, optimizer and scheduler. A
damaged one is passed over and named; the first that passes clears the mark, and the record
of what was reloaded (and what was passed over) is what lets `run --resume` continue from it
rather than from the damaged newest. Nothing verifies: the mark stays, exit 6 naming each.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateset_backend.common.errors import (
    InvalidInput,
    ResumeImpossible,
    StatesetError,
    Unsupported,
)
from stateset_backend.common.jsonio import atomic_write_json, read_json, utc_now
from stateset_backend.engines.adapter import Checkpoint
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.runs import quarantine
from stateset_backend.runs.store import RunStore
from stateset_backend.spec.content import sha256_file

VERIFIED_FILE = "verified.json"  # the newest `runs verify` record of a run

if TYPE_CHECKING:
    from stateset_backend.engines.registry import Registry


def verify_run(store: RunStore, registry: Registry, run_id: str) -> dict[str, Any]:
    run_dir = store.run_dir(run_id)
    if not run_id or Path(run_id).name != run_id or not (run_dir / "plan.json").is_file():
        raise InvalidInput(f"run {run_id}: not in {store.root} (see `runs list`)")
    plan = LaunchPlan.model_validate(read_json(run_dir / "plan.json", what="plan"))
    adapter = registry.get(plan.engine).adapter
    if not adapter.declares("reload_checkpoint"):
        raise Unsupported(f"engine {plan.engine}: its adapter does not declare how to reload a "
                          "checkpoint, so `runs verify` cannot prove one loads")
    marker = quarantine.active(run_dir)
    keep = " (the run stays quarantined)" if marker is not None else ""
    attempts = run_dir / "attempts"
    numbered = sorted((p for p in attempts.glob("*") if p.name.isdigit()),
                      key=lambda p: int(p.name), reverse=True) if attempts.is_dir() else []
    candidates = [(d, c) for d in numbered for c in reversed(adapter.checkpoints(d))]
    if not candidates:
        raise ResumeImpossible(f"run {run_id} has no complete checkpoint to reload{keep}")
    skipped: list[dict[str, Any]] = []
    for attempt_dir, checkpoint in candidates:  # newest first
        where = str(checkpoint.path.relative_to(run_dir))
        problem = adapter.checkpoint_problem(checkpoint, plan.experiment_digest)
        if problem is None:
            try:
                loaded = adapter.reload_checkpoint(attempt_dir, checkpoint)
            except StatesetError:
                raise
            except Exception as exc:  # the load itself failed: the checkpoint is not usable
                problem = f"does not reload: {type(exc).__name__}: {exc}"
        if problem is not None:
            skipped.append({"checkpoint": where, "update": checkpoint.update,
                            "problem": problem})
            continue
        manifest = checkpoint.path / "manifest.json"
        verified = {"attempt": int(attempt_dir.name), "update": checkpoint.update,
                    "checkpoint": where,
                    "manifest_sha256": sha256_file(manifest) if manifest.is_file() else None,
                    "loaded": loaded, "skipped": skipped}
        # the record a resume reads to continue from this checkpoint rather than a damaged
        # newer one, kept whether or not the run was marked
        atomic_write_json(run_dir / VERIFIED_FILE, {**verified, "verified_at": utc_now()})
        cleared = quarantine.clear(run_dir, verified) if marker is not None else None
        return {"run_id": run_id, "verified": verified, "was_quarantined": marker is not None,
                "quarantine": cleared}
    raise ResumeImpossible(f"run {run_id}: no checkpoint verifies: " + "; ".join(
        s["problem"] if s["checkpoint"] in s["problem"] else f"{s['checkpoint']}: "
        f"{s['problem']}" for s in skipped[:5]) + keep)


def verified_fallback(run_dir: Path, newest: Checkpoint) -> Checkpoint | None:
    """The checkpoint `runs verify` proved when it passed over ``newest`` as damaged: the one
    a resume continues from instead. Only what verify recorded, and only while it still holds:
    the folder is inside the attempt verify named and its manifest is the one it hashed."""
    try:
        verified = read_json(run_dir / VERIFIED_FILE, what="verification record")
    except InvalidInput:
        return None
    if not isinstance(verified, dict):
        return None
    passed_over = {s.get("checkpoint") for s in verified.get("skipped") or []
                   if isinstance(s, dict)}
    attempt, update, where = (verified.get("attempt"), verified.get("update"),
                              verified.get("checkpoint"))
    try:
        newest_rel = str(newest.path.relative_to(run_dir))
    except ValueError:
        return None
    if newest_rel not in passed_over or not isinstance(attempt, int) or \
            not isinstance(update, int) or not isinstance(where, str):
        return None
    folder = (run_dir / where).resolve()
    if not folder.is_relative_to((run_dir / "attempts" / str(attempt)).resolve()):
        return None  # a hand-edited record naming another run's or attempt's folder
    manifest = folder / "manifest.json"
    recorded = verified.get("manifest_sha256")
    if recorded is not None and (not manifest.is_file() or sha256_file(manifest) != recorded):
        return None  # rewritten since it was verified
    return Checkpoint(folder, update)

