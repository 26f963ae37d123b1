"""One rehearsal, in the order of a run: the rehearsal's spec and plan, the engine's own launch
of it on this machine's CPUs, collect-and-validate, and the verdict."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import atomic_write_json, utc_now
from stateset_backend.engines.adapter import Rehearsal
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import LaunchPlan, make_plan, verify_engine_version
from stateset_backend.providers.local import Exit, run_local
from stateset_backend.runs.rehearsal import resume, verdict, watch
from stateset_backend.runs.rehearsal.model import shrunk_model, token_counter
from stateset_backend.runs.runner import collect_and_validate, fill_placeholders, prepare_attempt
from stateset_backend.runs.store import Attempt
from stateset_backend.spec.content import directory_digest
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.inputs import builtin_model_dir, verify_inputs
from stateset_backend.spec.model import ExperimentSpec

REHEARSALS = ".rehearsals"
BUILTIN = "builtin:"  # the native engine's own tiny models: already a rehearsal's size


@dataclass(frozen=True)
class Verdict:
    folder: Path
    plan: LaunchPlan  # the rehearsal's own
    experiment_digest: str  # the spec's, as `run` would record it
    model: dict[str, Any]
    rehearsal: Rehearsal
    ended: Exit  # how the engine process ended
    seconds: float
    lines: list[verdict.Line]
    # spec settings the rehearsal changed besides the model and the budget, as (was, now)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    resumed: resume.Resumed | None = None  # the second start, from update N-1's checkpoint

    @property
    def passed(self) -> bool:
        return all(line.state != "FAILED" for line in self.lines)

    @property
    def interrupted(self) -> bool:
        return self.ended.interrupted or (self.resumed is not None and
                                          self.resumed.ended.interrupted)

    @property
    def launch_failed(self) -> bool:
        return self.lines[0].state == "FAILED"

    def to_json(self) -> dict[str, Any]:
        return {"rehearsal": {
            "run_id": self.plan.run_id, "folder": str(self.folder), "engine": self.plan.engine,
            "engine_version": self.plan.engine_version,
            "updates": self.plan.validated_spec().budget.total_updates,
            "seconds": round(self.seconds, 3), "experiment_digest": self.experiment_digest,
            "rehearsal_digest": self.plan.experiment_digest, "model": self.model,
            "covers": self.rehearsal.covers,
            "replaced": {k: list(v) for k, v in self.rehearsal.replaced.items()},
            "changed": {k: list(v) for k, v in self.changed.items()},
            "resumed": None if self.resumed is None else self.resumed.to_json()},
            "passed": self.passed, "checks": [line.to_json() for line in self.lines],
            "result": str(self.folder / "result.json")}


def rehearsal_of(plan: LaunchPlan, entry: AdapterEntry) -> Rehearsal:
    """The adapter's rehearsal of ``plan``, or ``Unsupported`` saying why its engine cannot run
    here."""
    with entry.guard("describing its rehearsal"):
        return entry.adapter.rehearse(plan)


def rehearsal_spec(spec: ExperimentSpec, base_dir: Path, root: Path, updates: int,
                   resumed: bool = False) -> tuple[ExperimentSpec, dict[str, Any],
                                                   dict[str, tuple[str, str]]]:
    """The spec with its model shrunk and ``updates`` updates, and, when the resume check runs
    (``resumed``), a checkpoint of the update before the last that outlives the next save;
    everything else as written, and the checkpoint settings changed as (was, now). It starts
    from seeded weights, never ``model.from_run``'s checkpoint (a full-size model's)."""
    doc = spec.model_dump(mode="json")
    doc["budget"]["total_updates"] = updates
    changed = resume.checkpoint_changes(doc, updates) if resumed else {}
    model: dict[str, Any] = {"path": spec.model.path, "shrunk": None}
    if not spec.model.path.startswith(BUILTIN):
        folder, model["shrunk"] = shrunk_model(spec, base_dir, root / "models")
        doc["model"].update(path=str(folder), revision=directory_digest(folder))
    doc["model"]["from_run"] = None
    try:
        return parse_spec(doc, source="the rehearsal's spec"), model, changed
    except InvalidInput as exc:
        raise InvalidInput(f"{exc.message} (with {updates} updates: pass another --updates)",
                           details=exc.details) from None


def rehearse(plan: LaunchPlan, entry: AdapterEntry, runs_dir: Path, updates: int, *,
             python: str | None, engine_home: str | None, timeout: float | None,
             echo_stderr: bool, live_progress: bool) -> Verdict:
    """Run the rehearsal of ``plan`` (the spec's, as `run` would make it) and judge it."""
    adapter = entry.adapter
    verify_engine_version(plan, adapter.installed_version(python, engine_home))
    spec, base_dir = plan.validated_spec(), Path(plan.base_dir)
    verify_inputs(spec, base_dir)
    root = runs_dir.resolve() / REHEARSALS
    no_resume = resume.unchecked(plan, adapter, updates)
    small, model, changed = rehearsal_spec(spec, base_dir, root, updates, no_resume is None)
    own = make_plan(small, entry, plan.engine_version, base_dir=base_dir)
    rehearsal = rehearsal_of(own, entry)
    folder = root / own.run_id
    attempt = Attempt(own.run_id, 1, folder / "attempt")
    attempt.directory.mkdir(parents=True)
    atomic_write_json(folder / "plan.json", own.to_json())
    if echo_stderr:
        print(f"stateset-backend: rehearsal {own.run_id}: {own.engine} {own.engine_version}, "
              f"{updates} updates on this machine's CPUs; its output is kept in {folder}",
              file=sys.stderr, flush=True)
    prepared = prepare_attempt(own, adapter, attempt, None, python=python,
                               engine_home=engine_home, echo_stderr=echo_stderr,
                               live_progress=live_progress)
    argv = [fill_placeholders(a, prepared.run_dir, python or sys.executable, engine_home)
            for a in rehearsal.argv]
    started, t0 = utc_now(), time.monotonic()
    env = {**rehearsal.environment(prepared.env), **watch.environment(prepared.run_dir)}
    exit_ = run_local(argv, cwd=prepared.run_dir, env=env,
                      timeout=timeout, echo_stderr=echo_stderr,
                      stdout_path=prepared.stdout_path, stderr_path=prepared.stderr_path)
    seconds = time.monotonic() - t0
    result = collect_and_validate(own, adapter, attempt, small, exit_, None, started=started,
                                  duration=seconds)
    atomic_write_json(folder / "result.json", result.to_json())
    resumed = None
    if no_resume is not None:
        resumed_line = verdict.Line(resume.NAME, "not measured", no_resume)
    elif exit_.code != 0 or exit_.interrupted or exit_.timed_out:
        resumed_line = verdict.Line(resume.NAME, "not measured", "the uninterrupted run did "
                                                                 "not finish")
    else:
        resumed, resumed_line = resume.rehearse_resume(
            own, adapter, rehearsal, small, folder, updates, python=python,
            engine_home=engine_home, timeout=timeout, echo_stderr=echo_stderr,
            live_progress=live_progress)
    launched = exit_.code == 0 and not exit_.interrupted and not exit_.timed_out
    tokenizer = builtin_model_dir(small.model.path) or Path(small.model.path)
    per_step = watch.per_step(small, own.deviations)
    watched = [*watch.reward_calls(small, base_dir, prepared.run_dir, updates,
                                   token_counter(tokenizer), launched, own.deviations),
               watch.learning_rate(small, verdict.rows_of(result, prepared.run_dir), per_step)]
    found = Verdict(folder, own, plan.experiment_digest, model, rehearsal, exit_, seconds,
                    verdict.lines(small, result, rehearsal, exit_, seconds, prepared.run_dir,
                                  updates, resumed_line, watched, per_step), changed, resumed)
    atomic_write_json(folder / "verdict.json", found.to_json())
    return found
