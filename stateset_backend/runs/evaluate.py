"""Held-out evaluation of a finished run's checkpoint, recorded apart from its training.

`evaluate RUN --split test --checkpoint recommended|final|update-N` picks a checkpoint the
attempt's result recorded, proves it is the one recorded (every file's sha256 against the
result, then the engine's own manifest) before anything loads it, and asks the engine's
adapter to score it with the spec's validation decoding. The engine must declare how it
evaluates (``EngineAdapter.evaluate_checkpoint``); the others are refused, since a number
computed some other way would not be the experiment's. The record goes to
``runs/<run>/evaluations/<split>-attempt<N>-<checkpoint>.json`` (written atomically), where
`runs show`, `runs compare` and `report` read it; training metrics are never touched.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateset_backend.common.errors import (
    EngineFailed,
    InvalidInput,
    ResumeImpossible,
    StatesetError,
    Unsupported,
)
from stateset_backend.common.jsonio import atomic_write_json, utc_now
from stateset_backend.engines.adapter import Checkpoint, EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.runs import history
from stateset_backend.runs.attempts import AttemptRecord, load_attempt
from stateset_backend.runs.evaluations import EVALUATION_DIR, EVALUATION_SCHEMA_ID
from stateset_backend.runs.quarantine import refuse_if_quarantined
from stateset_backend.runs.store import RunStore
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.inputs import verify_inputs

if TYPE_CHECKING:
    from stateset_backend.engines.registry import Registry

SPLITS = ("test", "validation")
_UPDATE = re.compile(r"update-(\d{1,9})")


@dataclass(frozen=True)
class ChosenCheckpoint:
    requested: str  # recommended | final | update-N
    update: int
    attempt: int  # whose folder holds it: a resumed attempt continues its predecessors'
    folder: str  # relative to that attempt's directory
    files: dict[str, str]  # path relative to that attempt's directory -> recorded sha256

    @property
    def label(self) -> str:
        return f"update-{self.update:06d}"


def choose_checkpoint(record: AttemptRecord, which: str) -> ChosenCheckpoint:
    """The named checkpoint of the attempt (or of one it continued), or exit 6 saying why
    there is none."""
    saved = history.checkpoints(record.directory.parent, record.result)
    result = record.result
    where = f"run {result.run_id} attempt {result.attempt}"
    have = ", ".join(str(u) for u in sorted(saved)) or "none"
    if which == "recommended":
        selection = result.selection or {}
        update = selection.get("update")
        if not isinstance(update, int):
            raise ResumeImpossible(f"{where} has no recommended checkpoint: " + (
                selection.get("reason", "") if selection else
                "the spec names no evaluation.select_by") + f" (checkpoints: {have})")
    elif which == "final":
        update = result.committed_updates
        if update not in saved:
            raise ResumeImpossible(f"{where}: its final update {update} has no checkpoint "
                                   f"(checkpoints at updates: {have}); pass --checkpoint "
                                   "update-N or recommended")
    else:
        match = _UPDATE.fullmatch(which)
        if match is None:
            raise InvalidInput(f"--checkpoint {which!r}: expected recommended, final or "
                               "update-N")
        update = int(match.group(1))
    named = (result.selection or {}).get("attempt") if which == "recommended" else None
    if update not in saved:
        raise ResumeImpossible(f"{where} has no checkpoint at update {update} (checkpoints "
                               f"at updates: {have})" + (
                                   f"; attempt {named}, which hashed the recommended one, has "
                                   "no readable result" if isinstance(named, int) and
                                   named != result.attempt else ""))
    found = saved[update]
    if isinstance(named, int) and named != found.attempt:
        raise ResumeImpossible(f"{where}: its selection names attempt {named}'s checkpoint of "
                               f"update {update}, but the hashes found are attempt "
                               f"{found.attempt}'s")
    return ChosenCheckpoint(which, update, found.attempt, found.folder, found.files)


def verify_recorded(record: AttemptRecord, chosen: ChosenCheckpoint, adapter: EngineAdapter,
                    experiment_digest: str) -> Checkpoint:
    """Exit 6 naming the file unless every file is the one the result hashed and the engine's
    own manifest holds; nothing is loaded before this passes."""
    home = record.directory.parent / str(chosen.attempt)
    for rel, digest in sorted(chosen.files.items()):
        path = home / rel
        if path.is_symlink() or not path.is_file():
            raise ResumeImpossible(f"{path}: missing (the checkpoint of update {chosen.update} "
                                   "is incomplete)")
        if sha256_file(path) != digest:
            raise ResumeImpossible(f"{path}: its content does not match the sha256 the run's "
                                   "result recorded (damaged or replaced)")
    checkpoint = Checkpoint(home / chosen.folder, chosen.update)
    problem = adapter.checkpoint_problem(checkpoint, experiment_digest)
    if problem is not None:
        raise ResumeImpossible(problem)
    return checkpoint



def evaluate_run(store: RunStore, registry: Registry, run_id: str, *, split: str,
                 which: str = "recommended", attempt: int | None = None,
                 ) -> tuple[Path, dict[str, Any]]:
    """Score one checkpoint of a run on a held-out split; the record's path and document."""
    if split not in SPLITS:
        raise InvalidInput(f"--split {split!r}: one of {', '.join(SPLITS)}")
    record = load_attempt(store, run_id, attempt)
    run_dir = store.run_dir(run_id)
    refuse_if_quarantined(run_dir, run_id, "evaluate it")
    plan = LaunchPlan.model_validate(record.plan)
    entry = registry.get(plan.engine)
    if not entry.adapter.declares("evaluate_checkpoint"):
        raise Unsupported(f"engine {plan.engine}: its adapter does not declare how to evaluate "
                          "a checkpoint, so `evaluate` cannot score its runs")
    spec = plan.validated_spec()
    data = getattr(spec.data, split)
    if data is None:
        raise InvalidInput(f"run {run_id}: its spec has no data.{split} split to evaluate on")
    if plan.provider == "local":
        verify_inputs(spec, Path(plan.base_dir))
    chosen = choose_checkpoint(record, which)
    checkpoint = verify_recorded(record, chosen, entry.adapter, plan.experiment_digest)
    started, t0 = utc_now(), time.monotonic()
    try:
        metrics = entry.adapter.evaluate_checkpoint(record.directory, checkpoint, split)
    except StatesetError:
        raise
    except Exception as exc:  # the engine's failure, reported as one line
        raise EngineFailed(f"run {run_id}: evaluating {chosen.label} on the {split} split "
                           f"failed: {type(exc).__name__}: {exc}") from None
    manifest = checkpoint.path / "manifest.json"
    doc: dict[str, Any] = {
        "schema": EVALUATION_SCHEMA_ID, "run_id": run_id, "attempt": record.result.attempt,
        "experiment_digest": plan.experiment_digest, "engine": plan.engine,
        "engine_version": plan.engine_version, "split": split,
        "data": {"uri": data.uri, "sha256": data.sha256},
        "checkpoint": {"requested": which, "update": chosen.update,
                       "attempt": chosen.attempt, "path": chosen.folder,
                       "files": chosen.files,
                       "manifest_sha256": sha256_file(manifest) if manifest.is_file()
                       else None},
        "decoding": {"temperature": spec.evaluation.temperature,
                     "top_p": spec.evaluation.top_p, "samples": spec.evaluation.samples,
                     "max_response_tokens": spec.data.max_response_tokens},
        "metrics": metrics, "started_at": started, "ended_at": utc_now(),
        "duration_s": round(time.monotonic() - t0, 3)}
    path = run_dir / EVALUATION_DIR / \
        f"{split}-attempt{record.result.attempt}-{chosen.label}.json"
    atomic_write_json(path, doc)
    store.record_evaluation(run_id, path.name, doc)
    return path, doc
