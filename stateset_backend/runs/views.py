"""Reading the run store back: what ran, whether it can be trusted, and how it compares.

Every run writes its plan and one result per attempt; these views answer the questions a user
asks afterwards (`runs list`, `runs show`, `runs compare`) from those files and the index,
never from memory of the run.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import read_json
from stateset_backend.runs import quarantine
from stateset_backend.runs.evaluations import records as evaluation_records
from stateset_backend.runs.results import Result
from stateset_backend.runs.store import RunStore

HEADLINE_METRICS = ("reward/mean", "val/reward/mean", "loss/policy", "kl", "loss/sft", "val/loss")


def _reason(result: Result) -> str:
    """The checks that failed; for an interrupted attempt only when it ended, since every other
    check then fails as a consequence (no identity, no metrics, no artifacts)."""
    if result.status == "interrupted":
        done = result.committed_updates
        return f"interrupted after update {done}" if done else \
            "interrupted before the first update was committed"
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    return "; ".join(failed)


def _attempt_results(store: RunStore, run_id: str) -> list[tuple[int, Result | None, str]]:
    """(attempt number, result or None, problem) for every attempt folder of a run."""
    attempts = store.run_dir(run_id) / "attempts"
    out: list[tuple[int, Result | None, str]] = []
    numbered = sorted((p for p in attempts.iterdir() if p.name.isdigit()),
                      key=lambda p: int(p.name)) if attempts.is_dir() else []
    for folder in numbered:
        path = folder / "result.json"
        if not path.is_file():
            out.append((int(folder.name), None, "no result.json (running, or ended without "
                                                "one)"))
            continue
        try:
            out.append((int(folder.name), Result.load(path), ""))
        except InvalidInput as exc:
            out.append((int(folder.name), None, f"unreadable result.json: {exc.message}"))
    return out


def show(store: RunStore, run_id: str) -> dict[str, Any]:
    """Identity, plan checksum, every attempt with its status and reason, checkpoints with
    their hashes, the selection and the declared deviations of one run."""
    plan_path = store.run_dir(run_id) / "plan.json"
    if not plan_path.is_file():
        raise InvalidInput(f"run {run_id}: not in {store.root} (see `runs list`)")
    plan = read_json(plan_path, what="plan")
    attempts = []
    for number, result, problem in _attempt_results(store, run_id):
        doc: dict[str, Any] = {"attempt": number}
        if result is None:
            doc.update(status="unknown", reason=problem)
        else:
            doc.update(status=result.status, reason=_reason(result),
                       committed_updates=result.committed_updates,
                       planned_updates=result.planned_updates,
                       started_at=result.started_at, duration_s=result.duration_s,
                       checkpoints=[{"path": a.path, "step": a.step, "bytes": a.bytes,
                                     "sha256": a.sha256} for a in result.artifacts
                                    if a.kind == "checkpoint"],
                       metrics={k: result.metrics.summary.get(k) for k in HEADLINE_METRICS
                                if k in result.metrics.summary},
                       selection=result.selection,
                       resumed_from=None if result.resumed_from is None else
                       result.resumed_from.model_dump(mode="json"))
        attempts.append(doc)
    return {"run_id": run_id, "experiment_digest": plan.get("experiment_digest"),
            "binding_digest": plan.get("binding_digest"), "plan_checksum": plan.get("checksum"),
            "engine": plan.get("engine"), "engine_version": plan.get("engine_version"),
            "seed": (plan.get("spec") or {}).get("seed"),
            "deviations": plan.get("deviations", []), "attempts": attempts,
            "quarantine": quarantine.read(store.run_dir(run_id)),
            "evaluations": [_evaluation(doc) for doc in
                            evaluation_records(store.run_dir(run_id))]}


def _evaluation(doc: dict[str, Any]) -> dict[str, Any]:
    """The parts of an evaluation record a listing shows."""
    checkpoint = doc.get("checkpoint") or {}
    return {"record": doc.get("record"), "attempt": doc.get("attempt"),
            "split": doc.get("split"), "checkpoint": checkpoint.get("requested"),
            "update": checkpoint.get("update"), "metrics": doc.get("metrics") or {}}


def compare(store: RunStore, targets: list[str]) -> dict[str, Any]:
    """Every attempt of the named runs, or of every run of the named experiment digests, side
    by side: engine and release, status, updates, final and recommended validation metrics,
    the held-out evaluations recorded for each attempt and the deviations each engine
    declared."""
    run_ids: list[str] = []
    digests = set()
    for target in targets:
        kind, name = store.resolve(target)
        if kind == "digest":
            digests.add(name)
            run_ids += [r["run_id"] for r in store.query(digest=name)]
        else:
            run_ids.append(name)
    rows = []
    for run_id in dict.fromkeys(run_ids):
        evaluations = [_evaluation(d) for d in evaluation_records(store.run_dir(run_id))]
        for number, result, problem in _attempt_results(store, run_id):
            if result is None:
                rows.append({"run_id": run_id, "attempt": number, "status": "unknown",
                             "reason": problem})
                continue
            digests.add(result.experiment_digest)
            rows.append({
                "run_id": run_id, "attempt": number, "engine": result.engine,
                "engine_version": result.engine_version, "status": result.status,
                "experiment_digest": result.experiment_digest,
                "committed_updates": result.committed_updates,
                "planned_updates": result.planned_updates,
                "final": {k: result.metrics.summary.get(k) for k in HEADLINE_METRICS
                          if k in result.metrics.summary},
                "recommended": result.selection,
                "test": [e for e in evaluations if e["attempt"] == number],
                "deviations": [d.get("deviation") for d in result.deviations],
                "reason": _reason(result)})
    return {"experiment_digests": sorted(digests), "same_experiment": len(digests) <= 1,
            "attempts": rows}
