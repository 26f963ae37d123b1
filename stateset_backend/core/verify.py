"""`runs verify RUN`: prove a run's newest checkpoint reloads whole, and only then lift its
quarantine.

The checkpoint is the one `run --resume` would continue from (the newest complete one of the
newest attempt that has one). Its manifest hashes are checked first; then the engine's
adapter loads it completely into a fresh model, optimizer and scheduler. Any failure keeps the
mark and exits 6 naming what is wrong; success clears it and records what was reloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import quarantine
from .content import sha256_file
from .errors import InvalidInput, ResumeImpossible, StatesetError, Unsupported
from .jsonio import read_json
from .plan import LaunchPlan
from .store import RunStore

if TYPE_CHECKING:
    from .registry import Registry


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
    found = next(((d, c) for d in numbered
                  if (c := adapter.latest_checkpoint(d)) is not None), None)
    if found is None:
        raise ResumeImpossible(f"run {run_id} has no complete checkpoint to reload{keep}")
    attempt_dir, checkpoint = found
    problem = adapter.checkpoint_problem(checkpoint, plan.experiment_digest)
    if problem is not None:
        raise ResumeImpossible(f"run {run_id}: the newest checkpoint (update "
                               f"{checkpoint.update}, {checkpoint.path}) does not verify: "
                               f"{problem}{keep}")
    try:
        loaded = adapter.reload_checkpoint(attempt_dir, checkpoint)
    except StatesetError:
        raise
    except Exception as exc:  # the load itself failed: the checkpoint is not usable
        raise ResumeImpossible(f"run {run_id}: the checkpoint of update {checkpoint.update} "
                               f"({checkpoint.path}) does not reload: {type(exc).__name__}: "
                               f"{exc}{keep}") from None
    manifest = checkpoint.path / "manifest.json"
    verified = {"attempt": int(attempt_dir.name), "update": checkpoint.update,
                "checkpoint": str(checkpoint.path.relative_to(run_dir)),
                "manifest_sha256": sha256_file(manifest) if manifest.is_file() else None,
                "loaded": loaded}
    cleared = quarantine.clear(run_dir, verified) if marker is not None else None
    return {"run_id": run_id, "verified": verified, "was_quarantined": marker is not None,
            "quarantine": cleared}
