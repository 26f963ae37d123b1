"""Running a plan: verify it, launch it, collect its outputs, check them, store the result."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateset_backend.common.errors import (
    EngineFailed,
    Interrupted,
    InvalidInput,
    InvalidResult,
    NotExecuted,
    ResumeImpossible,
    StatesetError,
    Unsupported,
)
from stateset_backend.common.jsonio import atomic_write_bytes, utc_now
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import (
    ENGINE_HOME,
    PYTHON,
    RUN_DIR,
    Checkpoint,
    EngineAdapter,
    LaunchContext,
    collect_outputs,
)
from stateset_backend.engines.registry import Registry
from stateset_backend.plan.launch_plan import LaunchPlan, verify_engine_version
from stateset_backend.providers import tether
from stateset_backend.providers.base import (
    EXIT_STOPPED,
    LocalProvider,
    PreparedLaunch,
    Provider,
    RayProvider,
)
from stateset_backend.providers.local import Exit
from stateset_backend.runs import history, lineage, quarantine
from stateset_backend.runs.results import (
    Check,
    Metrics,
    Result,
    ResumeLink,
    evaluate,
    never_started,
    nothing_ran,
    saved_checkpoints,
    select_checkpoint,
    summarize,
)
from stateset_backend.runs.runtime import check_resume
from stateset_backend.runs.store import RUNNING, Attempt, RunStore
from stateset_backend.runs.verify import verified_fallback
from stateset_backend.spec.inputs import verify_inputs
from stateset_backend.spec.model import ExperimentSpec

if TYPE_CHECKING:  # a kuberay plan's machinery loads for a kuberay plan only (run_plan)
    from stateset_backend.providers.kuberay.settings import KubeRaySettings

CANONICAL_SERIES = "canonical_metrics.jsonl"


def fill_placeholders(text: str, run_dir: Path, python: str, engine_home: str | None) -> str:
    """A launch's ``{run_dir}``, ``{python}`` and ``{engine_home}`` as this attempt fills them
    (the conformance kit fills a launch it runs the same way)."""
    if engine_home is not None:
        text = text.replace(ENGINE_HOME, engine_home)
    return text.replace(RUN_DIR, str(run_dir)).replace(PYTHON, python)



def require_exact_resume(plan: LaunchPlan, adapter: EngineAdapter) -> None:
    """Unsupported (exit 3) unless the plan's release promises an exact continuation: a
    resume of any other is a new experiment that only looks like the old one."""
    version = parse_version(plan.engine_version)
    if "resume:exact" not in adapter.contract.provided(version):
        raise Unsupported(f"{plan.engine} {plan.engine_version} cannot resume exactly "
                          "(no resume:exact in its contract)")


def find_resume_point(plan: LaunchPlan, adapter: EngineAdapter, store: RunStore) -> Checkpoint:
    """The newest complete checkpoint any earlier attempt of this run left, or exit 6."""
    require_exact_resume(plan, adapter)
    quarantine.refuse_if_quarantined(store.run_dir(plan.run_id), plan.run_id, "resume it")
    newest = newest_checkpoint(adapter, store, plan.run_id)
    if newest is None:
        attempts = store.run_dir(plan.run_id) / "attempts"
        count = len(attempt_dirs(store, plan.run_id))
        raise ResumeImpossible(f"run {plan.run_id} has no complete checkpoint to resume from "
                               f"in {attempts} ({count} earlier attempt(s))")
    attempt, found = newest
    # `runs verify` passed over the newest (damaged, or it did not reload) and proved an older
    # one: continue from that, whatever the newest's manifest says now
    fallback = verified_fallback(store.run_dir(plan.run_id), found)
    if fallback is not None and adapter.checkpoint_problem(
            fallback, plan.experiment_digest) is None:
        return fallback
    problem = adapter.checkpoint_problem(found, plan.experiment_digest)
    if problem is not None:  # never fall back silently to older state
        quarantine.mark(store.run_dir(plan.run_id), fault="restore", reason=problem,
                        update=found.update, attempt=attempt)
        raise ResumeImpossible(f"run {plan.run_id}: the newest checkpoint (update "
                               f"{found.update}, {found.path}) cannot be resumed: {problem}; "
                               "the run is quarantined until `stateset-backend runs verify "
                               f"{plan.run_id}` reloads a verified checkpoint")
    return found


def attempt_dirs(store: RunStore, run_id: str) -> list[Path]:
    """A run's attempt folders, newest first."""
    attempts = store.run_dir(run_id) / "attempts"
    return sorted((p for p in attempts.glob("*") if p.name.isdigit()),
                  key=lambda p: int(p.name), reverse=True) if attempts.is_dir() else []


def newest_checkpoint(adapter: EngineAdapter, store: RunStore,
                      run_id: str) -> tuple[int, Checkpoint] | None:
    """(attempt, checkpoint) of the newest complete checkpoint of any attempt, unchecked."""
    for attempt_dir in attempt_dirs(store, run_id):
        found = adapter.latest_checkpoint(attempt_dir)
        if found is not None:
            return int(attempt_dir.name), found
    return None


def completed(plan: LaunchPlan, store: RunStore) -> tuple[Result, Path] | None:
    """The run's result when an earlier attempt already finished every planned update."""
    latest = store.run_dir(plan.run_id) / "result.json"
    if not latest.is_file():
        return None
    try:
        result = Result.load(latest)
    except InvalidInput:
        return None
    if result.status == "succeeded" and result.committed_updates >= result.planned_updates:
        return result, latest
    return None


def run_plan(plan: LaunchPlan, registry: Registry, store: RunStore, *,
             python: str | None = None, timeout: float | None = None,
             echo_stderr: bool = True, resume: bool = False, live_progress: bool = True,
             engine_home: str | None = None, ray_address: str | None = None,
             allow_runtime_change: bool = False, apply: bool = False) -> tuple[Result, Path]:
    """Run one attempt of a plan; raises the error whose exit code matches the outcome.
    A resume first compares the checkpoint's recorded runtime with this launch's
    (runs.runtime): ``allow_runtime_change`` lets package versions differ, with a warning.
    A kuberay plan's attempt is executed only with ``apply`` (kubectl apply, then followed);
    without it the attempt's manifest is written and the attempt recorded ``prepared``."""
    entry = registry.get(plan.engine)
    adapter = entry.adapter
    if (entry.distribution, entry.version) != (plan.adapter.distribution,
                                               plan.adapter.version):
        raise Unsupported(f"the plan was made with {plan.adapter.distribution} "
                          f"{plan.adapter.version} but {entry.distribution} {entry.version} "
                          "is installed; make a new plan")
    on_cluster = plan.provider == "kuberay"
    kuberay: KubeRaySettings | None = None
    if on_cluster:  # its engine is the image's (provider_settings.image), not this machine's
        from stateset_backend.runs import kuberay_attempt

        kuberay = kuberay_attempt.preflight(plan, adapter, store, apply)
    if not on_cluster:
        verify_engine_version(plan, adapter.installed_version(python, engine_home))

    spec = plan.validated_spec()
    if plan.provider == "slurm":  # the login node sees the shared filesystem the nodes read
        from stateset_backend.providers.slurm.planning import check_runs_dir

        check_runs_dir(plan.provider_settings, store.root)
    if plan.provider in ("local", "slurm", "kuberay"):  # kuberay: the volume is seen here too
        verify_inputs(spec, Path(plan.base_dir))
    if not on_cluster and engine_home is None and any(ENGINE_HOME in a for a in plan.argv):
        raise InvalidInput("this plan runs an engine from its source checkout: pass "
                           "--engine-home DIR")
    record_abandoned(plan, adapter, store)  # what a killed `run` left, before going on
    resume_from = find_resume_point(plan, adapter, store) if resume else None
    start_from = lineage.resolve(spec, store, registry)  # before the attempt exists
    warnings = check_resume(adapter.checkpoint_runtime(resume_from),
                            adapter.current_runtime(spec, python),
                            allow_change=allow_runtime_change,
                            where=f"run {plan.run_id} update {resume_from.update}") \
        if resume_from is not None and not on_cluster else []  # there: the image's runtime
    try:
        attempt = store.begin_attempt(plan)
    except OSError as exc:
        raise InvalidInput(f"runs directory {store.root}: cannot record the run there: "
                           f"{exc.strerror or exc}") from None
    if echo_stderr:  # on screen at once: the engine may take seconds to load its model
        how = f"resuming from update {resume_from.update}" if resume_from is not None else \
            "starting" if apply or not on_cluster else "preparing"
        print(f"stateset-backend: run {plan.run_id} attempt {attempt.number}: {how} "
              f"{plan.engine} {plan.engine_version} ({plan.provider}); its output is kept in "
              f"{attempt.directory}", file=sys.stderr, flush=True)
    record = {"pid": os.getpid(), "started_at": utc_now(), "started": time.time(),
              "warnings": warnings, "resume_from": None if resume_from is None else
              {"path": str(resume_from.path), "update": resume_from.update}}
    try:
        # held for every provider: a cluster's job outlives a killed `run`, and the listing
        # tells the two apart by this lock (views.in_flight)
        with tether.hold(attempt.directory / RUNNING, record):
            if start_from is not None:
                lineage.stage(start_from, attempt.directory)
            return _run_attempt(plan, adapter, store, attempt, spec, resume_from,
                                python=python, timeout=timeout, echo_stderr=echo_stderr,
                                live_progress=live_progress,
                                engine_home=engine_home, ray_address=ray_address,
                                warnings=warnings, kuberay=kuberay, apply=apply)
    except OSError as exc:
        reason = f"could not write into the runs directory: {exc.strerror or exc}"
        path = _record_failure(plan, spec, store, attempt, reason)
        raise EngineFailed(f"run {plan.run_id} attempt {attempt.number} failed: {reason}"
                           + (f" (result: {path})" if path else " (attempt removed)")) \
            from None


def _record_failure(plan: LaunchPlan, spec: ExperimentSpec, store: RunStore, attempt: Attempt,
                    reason: str) -> Path | None:
    """Every attempt folder ends with a result.json saying what happened; when not even that
    can be written (a full disk), the folder is removed rather than left unexplained."""
    result = nothing_ran(plan, spec.budget.total_updates, attempt.number, "failed",
                         Check(name="store", ok=False, detail=reason))
    try:
        return store.finish(attempt, result)
    except OSError:
        shutil.rmtree(attempt.directory, ignore_errors=True)
        return None


def _run_attempt(plan: LaunchPlan, adapter: EngineAdapter, store: RunStore, attempt: Attempt,
                 spec: ExperimentSpec, resume_from: Checkpoint | None, *, python: str | None,
                 timeout: float | None, echo_stderr: bool, live_progress: bool,
                 engine_home: str | None, ray_address: str | None, warnings: list[str],
                 kuberay: KubeRaySettings | None = None,
                 apply: bool = False) -> tuple[Result, Path]:
    """Prepare the attempt, launch it where the plan says, collect and validate what the
    engine left: the data path of one attempt, in that order."""
    provider: Provider
    if kuberay is not None:
        from stateset_backend.runs import kuberay_attempt

        prepared, manifest = kuberay_attempt.prepare(plan, adapter, attempt, resume_from,
                                                     kuberay, echo_stderr)
        if not apply:  # nothing is executed, so nothing is collected or succeeds
            result = kuberay_attempt.not_applied(plan, spec, store, attempt, manifest, kuberay)
            return result, store.finish(attempt, result)
        provider = kuberay_attempt.provider(kuberay, prepared, manifest)
    else:
        prepared = prepare_attempt(plan, adapter, attempt, resume_from, python=python,
                                   engine_home=engine_home, echo_stderr=echo_stderr,
                                   live_progress=live_progress)
        provider = _provider(plan, ray_address, attempt)
    started, t0 = utc_now(), time.monotonic()
    exit_ = provider.launch(prepared, timeout)
    duration = time.monotonic() - t0
    result = collect_and_validate(plan, adapter, attempt, spec, exit_, resume_from,
                                  started=started, duration=duration, warnings=warnings)
    return result, store.finish(attempt, result)


def _provider(plan: LaunchPlan, ray_address: str | None, attempt: Attempt) -> Provider:
    if plan.provider == "ray":
        return RayProvider(ray_address or os.environ.get("RAY_ADDRESS"))
    if plan.provider == "slurm":
        from stateset_backend.providers.slurm.job import SlurmProvider

        return SlurmProvider()
    return _TetheredLocal([sys.executable, "-m", "stateset_backend.runs.abandoned",
                           str(attempt.directory.resolve())])


class _TetheredLocal(LocalProvider):
    """The local provider whose tether, should `run` die first, records the attempt with
    ``record`` once it has stopped the engine (runs/abandoned.py)."""

    def __init__(self, record: list[str]) -> None:
        self.record = record

    def _extra(self) -> dict[str, Any]:
        return {"on_orphaned": self.record}


def record_abandoned(plan: LaunchPlan, adapter: EngineAdapter, store: RunStore,
                     only: int | None = None) -> list[tuple[Result, Path]]:
    """Record every attempt of the run (or attempt ``only``) whose `run` process died before
    writing its result: a local one as interrupted with what it committed, a Slurm one once
    its job has ended, as Slurm says it ended.

    The tether runs this the moment it has stopped the engine of a killed `run`; the next
    `run` of the plan runs it again for an attempt whose tether died too (a whole cgroup
    killed), and for a Slurm job that outlived its `run`. Recording falls to a writer, never
    to `runs show` or `runs list`: those read the index alone or one run's files and load no
    engine plugin, while a result needs the adapter's collect, and an index row needs its
    writer. A cluster's job outlives `run` and may still be writing: a Slurm attempt waits
    for its job's end, and a RayJob's is left to the cluster. The attempt's lock tells a dead
    `run` from one still running, whatever killed it; claiming it keeps two recorders from
    both writing."""
    if plan.provider not in ("local", "slurm"):
        return []
    recorded = []
    folders = attempt_dirs(store, plan.run_id)  # newest first
    for i, folder in enumerate(folders):
        if (only is not None and int(folder.name) != only) or (folder / "result.json").exists():
            continue
        with tether.claim(folder / RUNNING, wait=1.0) as record:
            if record is None or (folder / "result.json").exists():
                continue
            ended = Exit(-1, interrupted=True, reason="the `run` process was killed before "
                         "it could stop its engine and record the attempt")
            if plan.provider == "slurm":
                from stateset_backend.providers.slurm.job import orphan_exit

                slurm_end = orphan_exit(folder)
                if slurm_end is None:
                    continue  # the job goes on, or Slurm cannot be asked here
                ended = slurm_end
            attempt = Attempt(plan.run_id, int(folder.name), folder)
            newer = any((f / "result.json").exists() for f in folders[:i])
            try:
                recorded.append(_record_orphan(plan, adapter, store, attempt, record,
                                               not newer, ended))
            except OSError:  # a full disk: the lock stays, the next reader tries again
                continue
            (folder / RUNNING).unlink(missing_ok=True)
    return recorded


def _record_orphan(plan: LaunchPlan, adapter: EngineAdapter, store: RunStore, attempt: Attempt,
                   record: dict[str, Any], latest: bool, exit_: Exit) -> tuple[Result, Path]:
    """The result of a killed `run`'s attempt, from what its engine left and how it ended: a
    local one as a Ctrl-C's is, its exit code unknown (the engine's parent died with it); a
    Slurm one as its job ended."""
    link = record.get("resume_from")
    resume_from = Checkpoint(Path(link["path"]), int(link["update"])) \
        if isinstance(link, dict) and {"path", "update"} <= link.keys() else None
    started = record.get("started")
    result = collect_and_validate(
        plan, adapter, attempt, plan.validated_spec(), exit_, resume_from,
        started=str(record.get("started_at") or utc_now()),
        duration=max(0.0, time.time() - started) if isinstance(started, float) else 0.0,
        warnings=[str(w) for w in record.get("warnings") or []])
    if exit_.code < 0:
        result = result.model_copy(update={"exit_code": None})
    return result, store.finish(attempt, result, latest_too=latest)


def prepare_attempt(plan: LaunchPlan, adapter: EngineAdapter, attempt: Attempt,
                    resume_from: Checkpoint | None, *, python: str | None,
                    engine_home: str | None, echo_stderr: bool,
                    live_progress: bool = True) -> PreparedLaunch:
    """Write the plan's files into the attempt and fill in its placeholders (never inside
    user text: specs cannot hold them)."""
    run_dir = attempt.directory.resolve()
    interpreter = python or sys.executable
    plan.write_files(run_dir)
    set_env = {k: fill_placeholders(v, run_dir, interpreter, engine_home)
               for k, v in plan.set_env.items()}
    env = {**os.environ, **set_env}
    argv = [fill_placeholders(a, run_dir, interpreter, engine_home) for a in plan.argv]
    if resume_from is not None:
        argv = adapter.resume_argv(resume_from, argv, run_dir)
    # the live bar only where a person watches a terminal; --json, a log or a pipe get one
    # line per update (the engine's stderr is a pipe to us either way, so we decide)
    live = live_progress and echo_stderr and sys.stderr.isatty()
    env["STATESET_BACKEND_PROGRESS"] = "tty" if live else "lines"
    if live:  # the engine's stderr is our pipe: tell it how wide the user's terminal is
        env["COLUMNS"] = str(shutil.get_terminal_size().columns)
    return PreparedLaunch(argv, run_dir, env, set_env,
                          f"stateset-{plan.run_id}-{attempt.number}", echo_stderr)


def collect_and_validate(plan: LaunchPlan, adapter: EngineAdapter, attempt: Attempt,
                         spec: ExperimentSpec, exit_: Exit, resume_from: Checkpoint | None, *,
                         started: str, duration: float,
                         warnings: list[str] | None = None) -> Result:
    """Read the engine's outputs back and run every result check; nothing is `succeeded`
    unless the engine exited 0 and every check passed."""
    run_dir = attempt.directory.resolve()
    dialect = plan.resolved_dialect()  # what the plan was translated with, not today's contract
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version, dialect)
    collected, collect_error = collect_outputs(adapter, run_dir, ctx)
    link, earlier = None, history.History()
    if resume_from is not None:
        source = history.source_attempt(run_dir.parent, resume_from.path)
        if source is not None:
            link = ResumeLink(attempt=source, update=resume_from.update)
            earlier = history.before(run_dir.parent, source, resume_from.update)
    status, checks, artifacts = evaluate(plan, exit_, collected, run_dir, collect_error,
                                         resume_from.update if resume_from else None)
    own = collected.metrics if collected is not None else []
    if resume_from is not None:  # an engine that logs its resume point again: once is enough
        own = [r for r in own if not isinstance(r.get("step"), int) or
               r["step"] > resume_from.update]
    rows = [*earlier.rows, *own]  # the run's series, not only this attempt's part of it
    if earlier.missing:
        warnings = [*(warnings or []), earlier.missing]
    series = None
    if rows:
        lines = "".join(json.dumps(row) + "\n" for row in rows)
        atomic_write_bytes(run_dir / CANONICAL_SERIES, lines.encode("utf-8"))
        series = CANONICAL_SERIES
    saved = {**earlier.checkpoints, **saved_checkpoints(attempt.number, artifacts)}
    return Result(
        run_id=plan.run_id, attempt=attempt.number, experiment_digest=plan.experiment_digest,
        binding_digest=plan.binding_digest, plan_checksum=plan.checksum, engine=plan.engine,
        engine_version=plan.engine_version, provider=plan.provider, status=status,
        exit_code=exit_.code if exit_.started else None, started_at=started,
        ended_at=utc_now(), duration_s=round(duration, 3),
        planned_updates=spec.budget.total_updates,
        committed_updates=collected.committed_updates if collected else 0,
        resumed_from=link,
        metrics=Metrics(series=series, summary=summarize(rows),
                        initial=summarize(rows, first=True),
                        raw_names=collected.raw_metric_names if collected else {}),
        selection=select_checkpoint(spec.evaluation.select_by, rows, saved),
        deviations=plan.deviations, artifacts=artifacts, checks=checks,
        warnings=warnings or [])


def stopped_by_cluster(result: Result) -> bool:
    """The engine checkpointed and stopped because its provider asked (a cluster's warning
    before its time limit or a pre-emption): resumable, and not the user's doing."""
    return result.status == "interrupted" and result.exit_code == EXIT_STOPPED


def raise_for_status(result: Result, path: Path, resume_from: int | None = None) -> None:
    """Map a non-successful result onto the error (and exit code) the CLI reports;
    ``resume_from`` is the update of the newest checkpoint a resume would start from."""
    detail = never_started(result) or \
        "; ".join(f"{c.name}: {c.detail}" for c in result.checks if not c.ok)
    errors: dict[str, type[StatesetError]] = {
        "interrupted": Interrupted, "failed": EngineFailed, "invalid": InvalidResult,
        "quarantined": EngineFailed, "prepared": NotExecuted}
    if result.status in errors:
        raise errors[result.status](f"run {result.run_id} attempt {result.attempt} "
                                    f"{result.status}: {detail} (result: {path})"
                                    f"{next_step(result, path, resume_from)}",
                                    details=result.to_json())


def next_step(result: Result, path: Path, resume_from: int | None) -> str:
    """The exact command that continues a stopped run, so that nobody starts it afresh by
    hand: resume from its newest checkpoint, or retry when there is none; a quarantined run
    needs ``runs verify`` first. Nothing for an invalid one, whose outputs are suspect."""
    import shlex

    if result.status not in ("interrupted", "failed", "quarantined"):
        return ""
    plan = path.parent / "plan.json"
    root = shlex.quote(str(plan.parent.parent))
    command = f"stateset-backend run {shlex.quote(str(plan))} --runs-dir {root}"
    if resume_from is None:
        return f"; no checkpoint to resume from, train it again from scratch with: {command} " \
            "--retry"
    resume = f"{command} --resume"
    if result.status == "quarantined":
        return (f"; verify it, then resume: stateset-backend runs verify {result.run_id} "
                f"--runs-dir {root} && {resume}")
    return f"; resume from the checkpoint of update {resume_from} with: {resume}"
