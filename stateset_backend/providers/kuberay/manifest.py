"""The RayJob manifest of one attempt: a pure function of the launch and the settings.

- The entrypoint is the launch's argv, each word shell-quoted (``shlex.quote``): KubeRay's
  submitter splices it into a ``bash -c`` line and ``ray job submit`` joins the words it gets
  back with ``shlex.join``, so every user string arrives at the engine as the same argv item.
- ``set_env`` (non-secret, the plan's own values) travels as the job's runtime environment.
  Variables the engine reads from its caller reach the pods only as ``secretKeyRef``s.
- Engines whose launch is a Ray driver (an adapter's ``cluster_launch`` "ray": verl,
  OpenRLHF, NeMo RL) get one worker pod per node of the spec with its GPUs; the driver runs on
  the head and the engine places its workers itself. Any other engine runs as one process: on
  a GPU worker (through ``entrypointNumGpus``) when the spec asks for GPUs, on the head
  otherwise.
- Names and labels are what Kubernetes and KubeRay accept: the RayJob's name is a DNS-1035
  label of at most 47 characters, label values at most 63 label-safe characters; the full
  run id and digests go into annotations.
- Ray's token authentication (``auth``) is ``rayClusterSpec.authOptions`` and nothing else:
  KubeRay v1.7.0 puts ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN`` (a ``secretKeyRef``) into the
  head, the workers and the submitter it builds, so the manifest names at most the Secret.
"""

from __future__ import annotations

import copy
import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.providers.kuberay.settings import GPU_RESOURCE, KubeRaySettings

API_VERSION, KIND = "ray.io/v1", "RayJob"
PREFIX = "stateset.dev/"
MAX_RAYJOB_NAME = 47  # KubeRay: 53 (RayCluster) less the 6 characters of its cluster suffix
VOLUME_NAME = "stateset-shared"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# bash expands these inside the double quotes KubeRay's submitter puts the runtime env in
_SUBMITTER_EXPANDS = ("$", "`")


@dataclass(frozen=True)
class AttemptLaunch:
    """One attempt's launch as the pods run it: placeholders already filled with in-pod paths."""

    run_id: str
    attempt: int
    engine: str
    experiment_digest: str
    binding_digest: str
    argv: list[str]
    set_env: dict[str, str] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)  # caller variables the engine reads
    nodes: int = 1
    gpus_per_node: int = 0
    # the adapter's cluster_launch: "ray" (the launch is a Ray driver: verl, OpenRLHF, NeMo RL),
    # "process" or "torchrun" (one process on one node here)
    layout: str = "process"


def pod_run_dir(settings: KubeRaySettings, run_id: str, attempt: int) -> str:
    """The attempt's folder as the pods see it: the run store's layout on the volume."""
    return str(settings.volume.pod_runs_dir() / run_id / "attempts" / str(attempt))


def rayjob_name(run_id: str, attempt: int) -> str:
    """``stateset-<run id>-<attempt>`` in lower case; a hash keeps it within KubeRay's limit."""
    name = f"stateset-{run_id.lower()}-{attempt}"
    if len(name) > MAX_RAYJOB_NAME or not _DNS1035.match(name):
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        stem = re.sub(r"[^a-z0-9-]+", "-", name)[:MAX_RAYJOB_NAME - 11].rstrip("-")
        name = f"{stem}-{digest}"
    return name


def label_value(text: str) -> str:
    """``text`` when it is a valid label value, else a readable stem and a hash of it."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:52].strip("-_.")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    return f"{stem}-{digest}" if stem else digest


def entrypoint(argv: list[str]) -> str:
    """The argv as one shell command line, each word quoted; a NUL cannot be carried."""
    if any("\0" in word for word in argv):
        raise InvalidInput("the launch holds a NUL byte, which no shell command can carry")
    return shlex.join(argv)


def runtime_env_yaml(set_env: dict[str, str]) -> str:
    import yaml

    for name, value in set_env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise InvalidInput(f"set_env {name!r}: not an environment variable name")
        bad = next((c for c in _SUBMITTER_EXPANDS if c in value or c in name), None)
        if bad is not None or "\0" in value:
            raise InvalidInput(f"set_env {name}: holds {bad or 'a NUL byte'!r}, which KubeRay's "
                               "submitter would expand in its shell; the kuberay provider "
                               "cannot carry it")
    return str(yaml.safe_dump({"env_vars": dict(sorted(set_env.items()))}, sort_keys=True,
                              allow_unicode=True, width=2**31 - 1))


def _workers(launch: AttemptLaunch, settings: KubeRaySettings) -> tuple[int, int, int]:
    """(worker pods, GPUs per worker, GPUs the driver reserves) for the engine's layout."""
    wanted, given = launch.gpus_per_node, settings.worker
    gpus = wanted if given.gpus is None else given.gpus
    if gpus < wanted:
        raise InvalidInput(f"worker.gpus {gpus} is fewer than the spec's resources.gpus_per_node "
                           f"{wanted}: the engine would wait for GPUs the cluster never has")
    if launch.layout == "ray":
        replicas = launch.nodes if given.replicas is None else given.replicas
        if replicas < launch.nodes:
            raise InvalidInput(f"worker.replicas {replicas} is fewer than the spec's "
                               f"resources.nodes {launch.nodes}")
        return replicas, gpus, 0
    if launch.nodes > 1:  # one entry point: torchrun across nodes needs a provider per node
        raise Unsupported(f"{launch.engine} starts once on KubeRay, on one node, and the spec "
                          f"asks for resources.nodes {launch.nodes}; set it to 1, or use the "
                          "slurm provider")
    if given.replicas not in (None, 1):
        raise InvalidInput(f"worker.replicas {given.replicas}: {launch.engine} runs as one "
                           "process, on one worker")
    if wanted == 0:
        return 0, 0, 0  # a CPU run: the driver is the engine, on the head
    return 1, gpus, wanted


def _pod(settings: KubeRaySettings, container: str, resources: dict[str, str],
         env: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{
            "name": container,
            "image": settings.image,
            "resources": {"requests": dict(resources), "limits": dict(resources)},
            **({"env": copy.deepcopy(env)} if env else {}),  # no YAML alias between pods
            "volumeMounts": [{"name": VOLUME_NAME, "mountPath": settings.volume.mount_path}],
        }],
        "volumes": [{"name": VOLUME_NAME,
                     "persistentVolumeClaim": {"claimName": settings.volume.claim_name}}],
    }
    if settings.service_account is not None:
        spec["serviceAccountName"] = settings.service_account
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def secret_env(launch: AttemptLaunch, settings: KubeRaySettings) -> list[dict[str, Any]]:
    """Every Secret-backed variable, as a reference: the value stays in the cluster."""
    clash = sorted(set(settings.secrets) & set(launch.set_env))
    if clash:
        raise InvalidInput(f"secrets {', '.join(clash)}: the plan sets these itself (set_env)")
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
            for name, ref in sorted(settings.secrets.items())]


def unset_env(launch: AttemptLaunch, settings: KubeRaySettings) -> list[str]:
    """Caller variables the engine reads that no Secret provides: unset in the pods."""
    return sorted(set(launch.env) - set(settings.secrets) - set(launch.set_env))


def build_manifest(launch: AttemptLaunch, settings: KubeRaySettings) -> dict[str, Any]:
    """The RayJob of one attempt, as a dict (``to_yaml`` writes it)."""
    replicas, gpus, driver_gpus = _workers(launch, settings)
    digest = launch.experiment_digest.removeprefix("sha256:")
    labels = {"app.kubernetes.io/managed-by": "stateset-backend",
              f"{PREFIX}run-id": label_value(launch.run_id),
              f"{PREFIX}attempt": str(launch.attempt),
              f"{PREFIX}engine": label_value(launch.engine),
              f"{PREFIX}experiment": digest[:32]}  # a label value holds 63 characters at most
    pod_labels = {k: v for k, v in labels.items() if k != f"{PREFIX}experiment"}
    env = secret_env(launch, settings)
    head_resources = {"cpu": settings.head.cpu, "memory": settings.head.memory}
    cluster: dict[str, Any] = {}
    if settings.ray_version is not None:
        cluster["rayVersion"] = settings.ray_version
    if settings.auth is not None:
        cluster["authOptions"] = {"mode": settings.auth.mode, **(
            {"secretName": settings.auth.secret_name} if settings.auth.secret_name else {})}
    cluster["headGroupSpec"] = {"rayStartParams": {},
                                "template": _pod(settings, "ray-head", head_resources, env,
                                                 pod_labels)}
    if replicas:
        worker_resources = {"cpu": settings.worker.cpu, "memory": settings.worker.memory}
        if gpus:
            worker_resources[GPU_RESOURCE] = str(gpus)
        cluster["workerGroupSpecs"] = [{
            "groupName": "workers", "replicas": replicas, "minReplicas": replicas,
            "maxReplicas": replicas, "rayStartParams": {},
            "template": _pod(settings, "ray-worker", worker_resources, env, pod_labels)}]
    spec: dict[str, Any] = {
        "entrypoint": entrypoint(launch.argv),
        "runtimeEnvYAML": runtime_env_yaml(launch.set_env),
        "submissionMode": settings.submission_mode,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
    }
    if settings.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    if driver_gpus:
        spec["entrypointNumGpus"] = driver_gpus
    spec["rayClusterSpec"] = cluster
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": rayjob_name(launch.run_id, launch.attempt),
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {f"{PREFIX}run-id": launch.run_id,
                            f"{PREFIX}attempt": str(launch.attempt),
                            f"{PREFIX}engine": launch.engine,
                            f"{PREFIX}experiment-digest": launch.experiment_digest,
                            f"{PREFIX}binding-digest": launch.binding_digest},
        },
        "spec": spec,
    }


def to_yaml(manifest: dict[str, Any], comments: list[str]) -> str:
    """The manifest as YAML, after ``#`` lines that say where it comes from."""
    import yaml

    if any("\n" in line or "\r" in line for line in comments):
        raise ValueError("a comment line holds a line break")
    head = "".join(f"# {line}\n" if line else "#\n" for line in comments)
    return head + str(yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True,
                                     width=2**31 - 1))
