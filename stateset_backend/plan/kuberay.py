"""What a ``kuberay`` plan adds to a launch: the paths the pods see, and the RayJob manifest.

The engine's launch is rendered on the planning machine, where the spec's folder, data and
reward files are read; for a kuberay plan they must lie on the shared volume (the pods could
not read them otherwise), and every path under the volume as this machine sees it
(``volume.local_path``) becomes the path the pods see (``volume.mount_path``). Only paths the
launch derived are mapped: a spec whose own strings hold this machine's view of the volume is
refused, so user text is never rewritten. ``{run_dir}``, ``{python}`` and ``{engine_home}`` are
filled with in-pod values when an attempt's manifest is built.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from stateset_backend.common.display import elided, elided_line
from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.engines.adapter import ENGINE_HOME, PYTHON, RUN_DIR
from stateset_backend.providers.kuberay.manifest import (
    AttemptLaunch,
    build_manifest,
    pod_run_dir,
    rayjob_name,
    to_yaml,
    unset_env,
)
from stateset_backend.providers.kuberay.settings import TOKEN_SECRET_KEY, KubeRaySettings
from stateset_backend.spec.inputs import local_path, pinned_files
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.hub import pinned_model_path

RAYJOB_FILE = "rayjob.yaml"
PROGRESS = {"STATESET_BACKEND_PROGRESS": "lines"}  # no terminal in a pod: one line per update


def settings_from(value: KubeRaySettings | dict[str, Any] | None) -> KubeRaySettings:
    """The provider's settings, or exit 2 naming the first bad field."""
    if isinstance(value, KubeRaySettings):
        return value
    if value is None:
        raise InvalidInput("the kuberay provider needs its settings: at least image and "
                           "volume (claim_name, mount_path); see docs/providers/kuberay.md")
    try:
        return KubeRaySettings.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(elided(str(part)) for part in first["loc"]) or "settings"
        raise InvalidInput(f"kuberay settings: {where}: {elided_line(first['msg'])}") from None


def _path_pattern(prefix: str) -> re.Pattern[str]:
    """``prefix`` as a whole path (or the start of one), not inside a longer name."""
    return re.compile(r"(?<![A-Za-z0-9._/+-])" + re.escape(prefix) + r"(?=/|$|[^A-Za-z0-9._+-])")


def map_paths(doc: Any, settings: KubeRaySettings) -> Any:
    """Every string of ``doc`` with this machine's view of the volume replaced by the pods'."""
    local, pod = settings.volume.local, settings.volume.mount_path
    if local == pod:
        return doc
    pattern = _path_pattern(local)
    if isinstance(doc, str):
        return pattern.sub(lambda _: pod, doc)
    if isinstance(doc, list):
        return [map_paths(item, settings) for item in doc]
    if isinstance(doc, dict):
        return {key: map_paths(value, settings) for key, value in doc.items()}
    return doc


def _strings(doc: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(doc, str):
        return [(path, doc)]
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _strings(v, f"{path}.{k}" if path else k)]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _strings(v, f"{path}.{i}")]
    return []


def check_on_volume(spec: ExperimentSpec, settings: KubeRaySettings, base_dir: Path,
                    launch: dict[str, Any]) -> None:
    """The spec's folder and every local file the launch reads lie on the shared volume."""
    root = PurePosixPath(settings.volume.local)
    where = f"the shared volume ({settings.volume.claim_name}, here at {root})"

    def on_volume(field: str, path: Path) -> None:
        real = PurePosixPath(path.resolve())
        if not real.is_relative_to(root):
            raise InvalidInput(f"{field}: {real} is not on {where}; the pods could not read it")

    on_volume("the spec's folder", base_dir)
    for field, path, _ in pinned_files(spec, base_dir):
        on_volume(field, path)
    model = pinned_model_path(spec)
    if model != spec.model.path:  # a pinned hub commit, loaded from the cache's snapshot
        if any(model in text for _, text in _strings(launch)) and \
                not PurePosixPath(model).is_relative_to(root):
            raise InvalidInput(f"model.revision: the pods load the cached snapshot {model}, "
                               f"which is not on {where}: set HF_HUB_CACHE (or HF_HOME) to a "
                               "folder on the volume when planning, and fetch the model there")
    else:
        found = local_path(model, base_dir)
        if found is not None and found.exists():
            on_volume("model.path", found)
    if settings.volume.local != settings.volume.mount_path:
        pattern = _path_pattern(settings.volume.local)
        for field, text in _strings(spec.model_dump(mode="json")):
            if pattern.search(text):
                raise InvalidInput(f"{field}: names {settings.volume.local}, this machine's view "
                                   "of the volume, which the pods see elsewhere; write it "
                                   "relative to the spec's folder")


def pod_launch(spec: ExperimentSpec, settings: KubeRaySettings, base_dir: Path,
               launch: dict[str, Any], native: dict[str, Any],
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rendered launch (argv, files, set_env, env) and native keys with the pods' paths,
    once everything they read is known to be on the volume."""
    check_on_volume(spec, settings, base_dir, {"launch": launch, "native": native})
    if ENGINE_HOME in "\0".join(launch["argv"]) and settings.engine_home is None:
        raise InvalidInput("this engine runs from its source checkout: set engine_home, its "
                           "path in the image")
    return map_paths(launch, settings), map_paths(native, settings)


def attempt_launch(plan: Any, settings: KubeRaySettings, attempt: int, layout: str,
                   argv: list[str] | None = None) -> AttemptLaunch:
    """One attempt of ``plan`` (a LaunchPlan, or its document's fields) as the pods run it;
    ``layout`` is the engine adapter's ``cluster_launch``."""
    run_dir = pod_run_dir(settings, plan.run_id, attempt)

    def fill(text: str) -> str:
        if settings.engine_home is not None:
            text = text.replace(ENGINE_HOME, settings.engine_home)
        return text.replace(RUN_DIR, run_dir).replace(PYTHON, settings.python)

    resources = plan.spec.get("resources") or {}
    return AttemptLaunch(
        run_id=plan.run_id, attempt=attempt, engine=plan.engine,
        experiment_digest=plan.experiment_digest, binding_digest=plan.binding_digest,
        argv=[fill(a) for a in (argv if argv is not None else plan.argv)],
        set_env={**{k: fill(v) for k, v in plan.set_env.items()}, **PROGRESS},
        env=list(plan.env), nodes=int(resources.get("nodes") or 1),
        gpus_per_node=int(resources.get("gpus_per_node") or 0), layout=layout)


def manifest_file(launch: AttemptLaunch, settings: KubeRaySettings, engine_version: str,
                  ) -> tuple[dict[str, Any], str]:
    """The attempt's manifest and its reviewable YAML, validated against KubeRay's CRDs when
    they are at hand (the header says which)."""
    from stateset_backend.providers.kuberay import crd

    manifest = build_manifest(launch, settings)
    folder = crd.crd_folder()
    checked = crd.validate(manifest, folder) if folder is not None else None
    name = rayjob_name(launch.run_id, launch.attempt)
    unset = unset_env(launch, settings)
    comments = [
        f"RayJob of run {launch.run_id} attempt {launch.attempt}: {launch.engine} "
        f"{engine_version}, made by stateset-backend.",
        f"The run's folder in the pods: {pod_run_dir(settings, launch.run_id, launch.attempt)}"
        f" (PersistentVolumeClaim {settings.volume.claim_name}).",
        f"Validated offline against {checked}." if checked else
        f"Not validated offline: {crd.missing_crds_reason()}.",
        f"Apply: kubectl apply --validate=strict -f {RAYJOB_FILE}; follow: kubectl get rayjob "
        f"{name} -n {settings.namespace}",
    ]
    if unset:
        comments.append(f"Not set in the pods (no Secret named for them): {', '.join(unset)}")
    if settings.auth is not None:
        secret = f"Secret {settings.auth.secret_name}" if settings.auth.secret_name else \
            "a Secret KubeRay creates for the cluster"
        comments.append(f"Ray token authentication: KubeRay gives the pods and the submitter "
                        f"RAY_AUTH_TOKEN from {secret} (key {TOKEN_SECRET_KEY}).")
    return manifest, to_yaml(manifest, comments)


def plan_manifest(doc: dict[str, Any], settings: KubeRaySettings, layout: str) -> str:
    """The reviewable manifest of the run's first attempt, for the plan's files."""
    from types import SimpleNamespace

    return manifest_file(attempt_launch(SimpleNamespace(**doc), settings, 1, layout), settings,
                         doc["engine_version"])[1]


def with_deadline(plan: Any, seconds: int, layout: str) -> tuple[dict[str, Any],
                                                                dict[str, str]]:
    """A kuberay plan's settings and first manifest with another ``activeDeadlineSeconds``,
    for a later attempt of its run: the run's identity is the experiment, not the cluster's
    deadline, so a run its deadline cut off goes on with more. Checked like the plan's own."""
    settings = settings_from({**plan.provider_settings, "active_deadline_seconds": seconds})
    manifest = manifest_file(attempt_launch(plan, settings, 1, layout), settings,
                             plan.engine_version)[1]
    return settings.model_dump(mode="json"), {**plan.files, RAYJOB_FILE: manifest}


def check_store(settings: KubeRaySettings, root: Path) -> None:
    """The run store must be the one on the volume: the engine writes where the pods see it."""
    expected = Path(str(settings.volume.local_runs_dir()))
    if root.resolve() != expected.resolve():
        raise InvalidInput(f"a kuberay plan runs into the run store on its volume, {expected} "
                           f"(the pods write to {settings.volume.pod_runs_dir()}); pass "
                           f"--runs-dir {expected}")


def same_manifest(plan: Any, settings: KubeRaySettings, layout: str) -> None:
    """The plan's reviewed manifest is what this stateset-backend builds for the first attempt:
    a plan made by another version is refused rather than run differently than reviewed."""
    import yaml

    reviewed = plan.files.get(RAYJOB_FILE)
    if reviewed is None:
        raise InvalidInput(f"the kuberay plan has no {RAYJOB_FILE}; make a new plan")
    built = build_manifest(attempt_launch(plan, settings, 1, layout), settings)
    if yaml.safe_load(reviewed) != built:
        raise Unsupported(f"the plan's {RAYJOB_FILE} differs from the manifest this "
                          "stateset-backend builds from the same plan; make a new plan")
