"""One attempt of a ``kuberay`` plan: its manifest written into the attempt, then applied and
followed only when asked.

The attempt's folder is on the shared volume (the run store there), so the engine in the pods
writes where the runner reads the outputs back. The plan's files go into it as for a local run;
the attempt's ``rayjob.yaml`` replaces the plan's (the first attempt's) with this attempt's
name, labels and folder. Without ``apply`` nothing is executed: the attempt is recorded as
``prepared`` (never ``succeeded``) and its result names the commands that apply it.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from stateset_backend.common.jsonio import atomic_write_bytes
from stateset_backend.plan import kuberay
from stateset_backend.providers.base import PreparedLaunch
from stateset_backend.providers.kuberay.job import KubeRayProvider, require_kubectl
from stateset_backend.providers.kuberay.manifest import rayjob_name
from stateset_backend.providers.kuberay.settings import KubeRaySettings
from stateset_backend.runs.results import Check, Result, nothing_ran

if TYPE_CHECKING:
    from stateset_backend.engines.adapter import Checkpoint, EngineAdapter
    from stateset_backend.plan.launch_plan import LaunchPlan
    from stateset_backend.runs.store import Attempt, RunStore
    from stateset_backend.spec.model import ExperimentSpec


def preflight(plan: LaunchPlan, adapter: EngineAdapter, store: RunStore,
              apply: bool) -> KubeRaySettings:
    """Before an attempt exists: kubectl is at hand when the attempt is to be applied, the run
    store is the volume's, and the plan's manifest is the one this stateset-backend builds."""
    if apply:
        require_kubectl()
    settings = kuberay.settings_from(plan.provider_settings)
    kuberay.check_store(settings, store.root)
    kuberay.same_manifest(plan, settings, adapter.cluster_launch)
    return settings


def prepare(plan: LaunchPlan, adapter: EngineAdapter, attempt: Attempt,
            resume_from: Checkpoint | None, settings: KubeRaySettings,
            echo_stderr: bool) -> tuple[PreparedLaunch, Path]:
    """The plan's files and this attempt's manifest in the attempt's folder; the launch as the
    pods run it (a resume's checkpoint staged here, its path the pods')."""
    run_dir = attempt.directory.resolve()
    for rel, content in plan.files.items():
        atomic_write_bytes(run_dir / rel, content.encode("utf-8"))
    launch = kuberay.attempt_launch(plan, settings, attempt.number, adapter.cluster_launch)
    if resume_from is not None:
        # the adapter stages the checkpoint into this machine's view of the folder and names
        # it by this machine's path, which becomes the pods'
        resumed = adapter.resume_argv(resume_from, launch.argv, run_dir)
        launch = replace(launch, argv=kuberay.map_paths(resumed, settings))
    _, text = kuberay.manifest_file(launch, settings, plan.engine_version)
    manifest = run_dir / kuberay.RAYJOB_FILE
    atomic_write_bytes(manifest, text.encode("utf-8"))
    prepared = PreparedLaunch(launch.argv, run_dir, {}, launch.set_env,
                              rayjob_name(plan.run_id, attempt.number), echo_stderr)
    return prepared, manifest


def provider(settings: KubeRaySettings, prepared: PreparedLaunch,
             manifest: Path) -> KubeRayProvider:
    return KubeRayProvider(manifest, prepared.submission_id, settings.namespace,
                           settings.submission_mode)


def prepared_screen(plan: LaunchPlan, store: RunStore, result: Result) -> str:
    """What `run` without ``--apply`` did, for the person who asked for it: not an error
    (nothing failed; the attempt was prepared as asked), ending with the command that
    applies it, so it can be copied from the last line."""
    settings = kuberay.settings_from(plan.provider_settings)
    attempt_dir = store.run_dir(plan.run_id) / "attempts" / str(result.attempt)
    manifest = shlex.quote(str(attempt_dir / kuberay.RAYJOB_FILE))
    plan_path = shlex.quote(str(store.run_dir(plan.run_id) / "plan.json"))
    root = shlex.quote(str(store.root))
    return "\n".join([
        f"run {plan.run_id} attempt {result.attempt}: prepared, not applied (nothing ran)",
        f"  RayJob   {settings.namespace}/{rayjob_name(plan.run_id, result.attempt)}",
        f"  manifest {manifest}",
        "next:",
        "  apply it and follow it to a checked result:",
        f"    stateset-backend run {plan_path} --runs-dir {root} --apply",
        "  or apply it yourself (its outputs land in this attempt, unchecked):",
        f"    kubectl apply --validate=strict -f {manifest}"])


def not_applied(plan: LaunchPlan, spec: ExperimentSpec, store: RunStore, attempt: Attempt,
                manifest: Path, settings: KubeRaySettings) -> Result:
    """What an attempt that was only prepared records: nothing ran, and how to run it."""
    plan_path = store.run_dir(plan.run_id) / "plan.json"
    run = (f"stateset-backend run {shlex.quote(str(plan_path))} --runs-dir "
           f"{shlex.quote(str(store.root))} --apply")
    detail = (f"the RayJob {settings.namespace}/{rayjob_name(plan.run_id, attempt.number)} was "
              f"written to {manifest}, not applied; apply it and follow it to a checked result "
              f"with: {run}; or apply it yourself (its outputs land in this attempt, "
              f"unchecked): kubectl apply --validate=strict -f {shlex.quote(str(manifest))}")
    return nothing_ran(plan, spec.budget.total_updates, attempt.number, "prepared",
                       Check(name="applied", ok=False, detail=detail))
