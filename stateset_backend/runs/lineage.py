"""Starting a run from another run's checkpoint (``model.from_run``): find it, prove it, stage it.

The reference names a stored run, one of its checkpoint folders and the sha256 of that
checkpoint's manifest; the manifest lists the sha256 of every file, so the reference pins the
exact starting weights and belongs to the experiment's identity. Before anything launches the
hub finds the checkpoint in the run store, checks it and stages it into the new attempt
(``from_run/``), where the engine reads it and checks the manifest hash again.

A reference to nothing (no such run, no such checkpoint, another manifest, a model that is not
the one the run trained) is invalid input, exit 2. A checkpoint with the named manifest whose
files no longer match it is damaged: exit 6, like any checkpoint that cannot be resumed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateset_backend.common.errors import InvalidInput, ResumeImpossible
from stateset_backend.common.jsonio import read_json
from stateset_backend.engines.adapter import Checkpoint, EngineAdapter, stage_checkpoint
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.model import ExperimentSpec, FromRun

if TYPE_CHECKING:  # the plugin API re-exports STAGED_CHECKPOINT: no run store (sqlite3) at load
    from stateset_backend.engines.registry import Registry
    from stateset_backend.runs.store import RunStore

STAGED_CHECKPOINT = "from_run"  # inside the attempt directory
MANIFEST = "manifest.json"
# what the starting weights must fit: the same architecture, tokenizer and adapters
SAME_MODEL = ("path", "revision", "lora")


def resolve(spec: ExperimentSpec, store: RunStore, registry: Registry) -> Path | None:
    """The verified checkpoint folder ``model.from_run`` names, or None without one."""
    ref = spec.model.from_run
    if ref is None:
        return None
    where = f"model.from_run: run {ref.run_id}"
    plan, adapter = _stored_run(store, registry, ref.run_id, where)
    _same_model(plan, spec, where)
    found = _named(adapter, store.run_dir(ref.run_id) / "attempts", ref.checkpoint)
    if not found:
        raise InvalidInput(f"{where} has no checkpoint {ref.checkpoint} (`runs from-run "
                           f"{ref.run_id}` lists the ones it has)")
    for checkpoint in found:
        if sha256_file(checkpoint.path / MANIFEST) == ref.sha256:
            problem = adapter.checkpoint_problem(checkpoint, str(plan.get("experiment_digest")))
            if problem is not None:
                raise ResumeImpossible(f"{where}: checkpoint {ref.checkpoint} is damaged: "
                                       f"{problem}")
            return checkpoint.path
    raise InvalidInput(f"model.from_run.sha256: the manifest of run {ref.run_id}'s checkpoint "
                       f"{ref.checkpoint} has sha256 {sha256_file(found[0].path / MANIFEST)}, "
                       f"not {ref.sha256}")


def stage(checkpoint: Path, attempt_dir: Path) -> None:
    """The verified checkpoint, staged where the engine reads it."""
    stage_checkpoint(checkpoint, attempt_dir / STAGED_CHECKPOINT)


def reference(store: RunStore, registry: Registry, run_id: str,
              checkpoint: str | None = None) -> FromRun:
    """The ``model.from_run`` section that names a checkpoint of a stored run: ``checkpoint``
    or the newest complete one of its newest attempt that has any."""
    _, adapter = _stored_run(store, registry, run_id, f"run {run_id}")
    attempts = store.run_dir(run_id) / "attempts"
    for attempt_dir in _newest_first(attempts):
        if checkpoint is None:
            newest = adapter.latest_checkpoint(attempt_dir)
            if newest is None:
                continue
            found = newest
        else:
            named = adapter.named_checkpoint(attempt_dir, checkpoint)
            if named is None:
                continue
            found = named
        if not (found.path / MANIFEST).is_file():
            continue
        return FromRun(run_id=run_id, checkpoint=checkpoint_name(found.update),
                       sha256=sha256_file(found.path / MANIFEST))
    what = f"checkpoint {checkpoint}" if checkpoint else "complete checkpoint"
    raise InvalidInput(f"run {run_id} has no {what} in {attempts}")


def checkpoint_name(update: int) -> str:
    """How ``model.from_run`` names a checkpoint on every engine: the update it was saved at
    (the native engine's folder name; an engine that names its folders otherwise maps it in
    ``named_checkpoint``)."""
    return f"update-{update:06d}"


def _stored_run(store: RunStore, registry: Registry, run_id: str,
                where: str) -> tuple[dict[str, Any], EngineAdapter]:
    """The run's plan and the adapter of the engine that ran it."""
    plan_path = store.run_dir(run_id) / "plan.json"
    if not plan_path.is_file():
        raise InvalidInput(f"{where} is not in {store.root} (see `runs list`)")
    plan = read_json(plan_path, what="plan")
    return plan, registry.get(str(plan.get("engine"))).adapter


def _newest_first(attempts: Path) -> list[Path]:
    return sorted((p for p in attempts.glob("*") if p.name.isdigit()),
                  key=lambda p: int(p.name), reverse=True) if attempts.is_dir() else []


def _named(adapter: EngineAdapter, attempts: Path, name: str) -> list[Checkpoint]:
    """Every attempt's checkpoint called ``name``, newest attempt first."""
    found = (adapter.named_checkpoint(a, name) for a in _newest_first(attempts))
    return [c for c in found if c is not None]


def _same_model(plan: dict[str, Any], spec: ExperimentSpec, where: str) -> None:
    trained = (plan.get("spec") or {}).get("model") or {}
    mine = spec.model.model_dump(mode="json")
    for key in SAME_MODEL:
        if trained.get(key) != mine[key]:
            raise InvalidInput(f"{where} trained model.{key} {trained.get(key)!r}; this spec "
                               f"names {mine[key]!r}, which its weights do not fit")
