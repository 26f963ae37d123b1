"""Reading the run store back: what ran, whether it can be trusted, and how it compares.

Every run writes its plan and one result per attempt; these views answer the questions a user
asks afterwards, never from memory of the run: `runs show` from the files of the one run it
names, `runs compare` (like `runs list`) from the index alone, whatever the size of the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import read_json
from stateset_backend.providers import tether
from stateset_backend.runs import quarantine
from stateset_backend.runs.evaluations import entry as evaluation_entry
from stateset_backend.runs.evaluations import records as evaluation_records
from stateset_backend.runs.store import RUNNING, RunStore

if TYPE_CHECKING:  # only `runs show` reads results; listings and comparisons read the index
    from stateset_backend.runs.results import Result


def _attempt_results(store: RunStore, run_id: str,
                     provider: str) -> list[tuple[int, Result | None, str]]:
    """(attempt number, result or None, problem) for every attempt folder of a run."""
    from stateset_backend.runs.results import Result

    attempts = store.run_dir(run_id) / "attempts"
    out: list[tuple[int, Result | None, str]] = []
    numbered = sorted((p for p in attempts.iterdir() if p.name.isdigit()),
                      key=lambda p: int(p.name)) if attempts.is_dir() else []
    for folder in numbered:
        path = folder / "result.json"
        if not path.is_file():
            out.append((int(folder.name), None, _no_result(folder, provider)))
            continue
        try:
            out.append((int(folder.name), Result.load(path), ""))
        except InvalidInput as exc:
            out.append((int(folder.name), None, f"unreadable result.json: {exc.message}"))
    return out


def _no_result(folder: Path, provider: str) -> str:
    """Why an attempt has no result yet: its `run` still runs, or died and its tether with it
    (the next `run` of the plan records it, a Slurm one once its job has ended: this view
    loads no engine plugin to collect it). A cluster's job outlives its `run`: what the
    cluster says of it now."""
    job_file = folder / "slurm" / "job_id"
    if provider == "slurm" and job_file.is_file():
        job = job_file.read_text(encoding="utf-8", errors="replace").strip()
        if job.isdigit():
            row = _slurm_state(job, tether.held(folder / RUNNING))
            if row["state"] == ABANDONED:
                return f"no result.json: {row['reason']}"
            said = f": {row['reason']}" if row["reason"] else ""
            return f"no result.json: Slurm job {job} {row['state']}{said}"
    if not (folder / RUNNING).exists():
        return "no result.json (running, or ended without one)"
    if tether.held(folder / RUNNING):
        return "no result.json yet: its `run` process is running"
    if provider != "local":
        return (f"no result.json: its `run` process was killed before recording it; its "
                f"{provider} job may go on, and nothing records its result")
    return ("no result.json: its `run` process was killed before recording it; the next `run` "
            "of its plan records it as interrupted")


def record_submitted(attempt_dir: Path, provider: str, job: str) -> None:
    """A cluster accepted this attempt's job: the index shows it as in flight until its
    result replaces it (listens to providers.base.SUBMITTED while `run` runs)."""
    from stateset_backend.runs import index

    run_dir = attempt_dir.parent.parent
    RunStore(run_dir.parent)._write(lambda conn: index.put_in_flight(
        conn, run_dir.name, int(attempt_dir.name), provider, job))


ABANDONED = "abandoned"  # the job ended, its `run` is gone, and no result was recorded
_UNRECORDED = "its `run` process is gone, so no result was recorded"


def in_flight(store: RunStore) -> list[dict[str, Any]]:
    """Attempts a cluster accepted that have no result yet, newest first, each with its
    provider's state now: a Slurm job's as the controller says it (``pending`` with Slurm's
    reason, ``running``), a RayJob's as kubectl reads it; ``job_state`` is the provider's own
    word for it. From the index, the provider and the attempt's liveness lock, which tells a
    ``run`` that still follows the job from one that was killed while the job goes on: such
    an attempt shows the job's state and that no result will be recorded, and once the job
    has ended it is ``abandoned`` (with the job's last state) instead of in flight."""
    from stateset_backend.runs import index

    rows = []
    for run_id, attempt, provider, job in store._select(index.IN_FLIGHT, []):
        alive = tether.held(store.run_dir(run_id) / "attempts" / str(attempt) / RUNNING)
        row = {"run_id": run_id, "attempt": attempt, "provider": provider, "job": job,
               "state": "unknown", "job_state": "", "reason": "",
               "run_process": "running" if alive else "gone"}
        if provider == "slurm":
            row.update(_slurm_state(job, alive))
        elif provider == "kuberay":
            row.update(_rayjob_state(job, alive))
        rows.append(row)
    return rows


def _orphaned(job: str, provider: str) -> str:
    namespace, _, name = job.partition("/")
    stop = f"scancel {job}" if provider == "slurm" else \
        f"kubectl delete rayjob {name} -n {namespace}"
    return (f"its `run` process is gone: the job goes on, but nothing will record its result "
            f"({stop} stops it)")


def _slurm_state(job: str, alive: bool) -> dict[str, str]:
    """A Slurm job's row as the controller (or its accounting) says it now."""
    from stateset_backend.common.errors import StatesetError
    from stateset_backend.providers.slurm.job import ENDED, job_state

    try:
        state = job_state(job)
    except StatesetError as exc:  # no Slurm client on this machine
        return {"state": "unknown", "reason": exc.message}
    if state is None:
        gone = "" if alive else f"; {_UNRECORDED}"
        return {"state": "unknown" if alive else ABANDONED,
                "reason": f"Slurm no longer knows the job{gone}"}
    if state.state in ENDED and not alive:
        code = "" if state.exit_code is None else f", exit code {state.exit_code}"
        return {"state": ABANDONED, "job_state": state.state,
                "reason": f"Slurm job {job} ended {state.state}{code}; {_UNRECORDED}"}
    said = [state.reason or ""] if alive else [state.reason or "", _orphaned(job, "slurm")]
    return {"state": state.state.lower(), "job_state": state.state,
            "reason": "; ".join(part for part in said if part)}


def _rayjob_state(job: str, alive: bool = True) -> dict[str, str]:
    """A RayJob's state as kubectl reads it now (``namespace/name``)."""
    from stateset_backend.common.errors import StatesetError
    from stateset_backend.providers.kuberay.job import ENDED, read_state

    namespace, _, name = job.partition("/")
    try:
        got = read_state(name, namespace)
    except StatesetError as exc:  # no kubectl here
        return {"reason": exc.message}
    if got is None:
        if not alive:
            return {"state": ABANDONED,
                    "reason": f"the RayJob is not in the cluster; {_UNRECORDED}"}
        return {"state": "gone", "reason": "the RayJob is not in the cluster"}
    if isinstance(got, str):
        return {"reason": got}
    said = f", {got.reason}" if got.reason else ""
    deployment = got.deployment or "New"
    if got.deployment in ENDED and not alive:
        return {"state": ABANDONED, "job_state": deployment,
                "reason": f"the RayJob ended {got.describe()}; {_UNRECORDED}"}
    orphan = "" if alive else f"; {_orphaned(job, 'kuberay')}"
    return {"state": deployment.lower(), "job_state": deployment,
            "reason": f"job {got.job or 'PENDING'}{said}{orphan}"}


def show(store: RunStore, run_id: str) -> dict[str, Any]:
    """Identity, plan checksum, every attempt with its status and reason, checkpoints with
    their hashes, the selection and the declared deviations of one run."""
    plan_path = store.run_dir(run_id) / "plan.json"
    if not plan_path.is_file():
        raise InvalidInput(f"run {run_id}: not in {store.root} (see `runs list`)")
    from stateset_backend.runs.results import HEADLINE_METRICS, failure_reason

    plan = read_json(plan_path, what="plan")
    attempts = []
    for number, result, problem in _attempt_results(store, run_id,
                                                     str(plan.get("provider") or "local")):
        doc: dict[str, Any] = {"attempt": number}
        if result is None:
            doc.update(status="unknown", reason=problem)
        else:
            doc.update(status=result.status, reason=failure_reason(result),
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
            "evaluations": [evaluation_entry(doc) for doc in
                            evaluation_records(store.run_dir(run_id))]}


def compare(store: RunStore, targets: list[str], *, limit: int | None = None,
            offset: int = 0) -> dict[str, Any]:
    """Every attempt of the named runs, or of every run of the named experiment digests (newest
    run first), side by side, from the index: engine and release, status, updates, final and
    recommended validation metrics, the held-out evaluations recorded for each attempt and the
    deviations each engine declared. ``limit`` runs after ``offset`` are shown; ``runs`` and
    ``more_runs`` count them all and those after the page."""
    run_ids: list[str] = []
    digests = set()
    for target in targets:
        kind, name = store.resolve(target)
        if kind == "digest":
            digests.add(name)
            run_ids += store.run_ids(digest=name)
        else:
            run_ids.append(name)
    run_ids = list(dict.fromkeys(run_ids))
    shown = run_ids[offset:] if limit is None else run_ids[offset:offset + limit]
    rows = []
    for doc in store.attempts(shown):
        detail = doc["detail"]
        if doc["status"] == "unreadable":
            rows.append({"run_id": doc["run_id"], "attempt": doc["attempt"],
                         "status": "unreadable", "reason": detail.get("reason", "")})
            continue
        digests.add(doc["experiment_digest"])
        rows.append({
            "run_id": doc["run_id"], "attempt": doc["attempt"], "engine": doc["engine"],
            "engine_version": doc["engine_version"], "status": doc["status"],
            "experiment_digest": doc["experiment_digest"],
            "committed_updates": doc["committed_updates"],
            "planned_updates": doc["planned_updates"], "final": detail.get("final", {}),
            "recommended": detail.get("recommended"), "test": doc["test"],
            "deviations": detail.get("deviations", []), "reason": detail.get("reason", "")})
    return {"experiment_digests": sorted(digests), "same_experiment": len(digests) <= 1,
            "attempts": rows, "runs": len(run_ids),
            "more_runs": max(0, len(run_ids) - offset - len(shown))}
