"""What a KubeRay plan asks of the Kubernetes cluster, checked before anything is written.

Every value here ends up in the RayJob manifest, so each is validated to what Kubernetes
accepts for it (DNS names, label-safe keys, resource quantities, image references, absolute
paths without shell or YAML syntax). The run directory lives on a shared volume (a
PersistentVolumeClaim) that the pods mount at ``volume.mount_path``; the machine that plans and
runs sees the same volume at ``volume.local_path`` (the same path by default). Inside the pods
every path is the pods' path: the planning machine's view of the volume never reaches them.
Environment variables the engine reads from its caller (API keys, tokens) reach the pods only
as references to Kubernetes Secrets, never as values; so does a cluster's Ray token, which
KubeRay itself hands to every Ray container and to its job submitter (``auth``).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

INT32_MAX = 2**31 - 1
GPU_RESOURCE = "nvidia.com/gpu"

# RFC 1123 names, as Kubernetes validates them (IsDNS1123Label / IsDNS1123Subdomain)
DnsLabel = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
DnsSubdomain = Annotated[str, Field(
    pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    max_length=253)]
# a Secret's data key (IsConfigMapKey) and an environment variable's name (C identifier)
SecretKey = Annotated[str, Field(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=253)]
# Kubernetes resource quantities in their plain forms: 8, 500m, 1.5, 64Gi, 512M
Quantity = Annotated[str, Field(
    pattern=r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$", max_length=32)]
# an OCI image reference: [registry[:port]/]path[:tag][@digest], as the distribution
# project's reference grammar spells it (lower-case path components, tag of word characters)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*" \
          r"[a-zA-Z0-9])?)*(?::[0-9]+)?/)?"
ImageRef = Annotated[str, Field(
    pattern=rf"^{_DOMAIN}{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
            r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$",
    max_length=255)]
RayVersion = Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]
# KubeRay v1.7.0's ValidateRayClusterSpec refuses authOptions.mode token below this Ray
TOKEN_AUTH_MIN_RAY = (2, 52, 0)
# what KubeRay sets in each Ray container and in the submitter when the token mode is on
TOKEN_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
TOKEN_SECRET_KEY = "auth_token"  # the data key KubeRay reads the token from
# a path inside the pods: absolute, and only characters that need no quoting in a shell word,
# a YAML scalar or a JSON string, so it can be placed into the launch as it is
_SAFE_PATH = r"^(/[A-Za-z0-9._+-]+)+$"
PodPath = Annotated[str, Field(pattern=_SAFE_PATH, max_length=1024)]


def _normal_path(value: str, field: str) -> str:
    path = PurePosixPath(value)
    if ".." in path.parts or "." in value.split("/"):
        raise ValueError(f"{field}: must not hold '.' or '..' segments")
    return str(path)


class SecretRef(BaseModel):
    """One key of a Kubernetes Secret in the RayJob's namespace."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: DnsSubdomain = Field(description="the Secret's name")
    key: SecretKey = Field(description="the key inside the Secret")


class RayAuth(BaseModel):
    """Ray's token authentication on the RayJob's cluster (``rayClusterSpec.authOptions``).

    KubeRay does the wiring, so the plan carries no token: it gives the head, every worker and
    the job's submitter (K8sJobMode's Kubernetes Job, SidecarMode's container, HTTPMode's own
    client) ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the Secret's ``auth_token``
    key. Without ``secret_name`` KubeRay makes a Secret with a random token for each cluster,
    which suits a RayJob: nothing outside its cluster needs the token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["token"] = Field(description="Ray's token authentication (leave auth out "
                                               "for none)")
    secret_name: DnsSubdomain | None = Field(
        None, description=f"a Secret in the namespace whose key {TOKEN_SECRET_KEY} holds the "
                          "token (default: KubeRay creates one per cluster)")


class SharedVolume(BaseModel):
    """The PersistentVolumeClaim the run directory lives on, seen by the pods and by the
    machine that plans and runs (which writes the plan's files and reads the outputs back)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    claim_name: DnsSubdomain = Field(description="the PersistentVolumeClaim, in the namespace")
    mount_path: PodPath = Field(description="where the pods mount it")
    local_path: PodPath | None = Field(
        None, description="where this machine sees the same volume (default: mount_path); the "
                          "spec's folder, its data and reward files and the run store lie "
                          "under it")
    runs_subdir: str = Field("runs", pattern=r"^[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$",
                             max_length=255,
                             description="the run store, relative to the volume's root")

    @field_validator("mount_path", "local_path")
    @classmethod
    def _normal(cls, value: str | None) -> str | None:
        return None if value is None else _normal_path(value, "path")

    @field_validator("runs_subdir")
    @classmethod
    def _relative(cls, value: str) -> str:
        if any(part in (".", "..") for part in value.split("/")):
            raise ValueError("must not hold '.' or '..' segments")
        return value

    @model_validator(mode="after")
    def _not_nested(self) -> SharedVolume:
        local, pod = PurePosixPath(self.local), PurePosixPath(self.mount_path)
        if local != pod and (local.is_relative_to(pod) or pod.is_relative_to(local)):
            raise ValueError(f"local_path {local} and mount_path {pod} must be the same path or "
                             "neither inside the other")
        return self

    @property
    def local(self) -> str:
        return self.local_path or self.mount_path

    def pod_runs_dir(self) -> PurePosixPath:
        return PurePosixPath(self.mount_path) / self.runs_subdir

    def local_runs_dir(self) -> PurePosixPath:
        return PurePosixPath(self.local) / self.runs_subdir


class PodResources(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: Quantity = Field(description="CPU request and limit")
    memory: Quantity = Field(description="memory request and limit")


class WorkerResources(PodResources):
    gpus: int | None = Field(None, ge=0, le=1024,
                             description=f"{GPU_RESOURCE} per worker (default: the spec's "
                                         "resources.gpus_per_node)")
    replicas: int | None = Field(None, ge=1, le=10000,
                                 description="worker pods (default: the spec's resources.nodes)")


class KubeRaySettings(BaseModel):
    """How one plan runs as a KubeRay ``RayJob`` (``plan --provider kuberay``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: ImageRef = Field(description="the container image of every Ray pod: Ray and the "
                                        "engine at the plan's version (pin it by digest)")
    namespace: DnsLabel = "default"
    ray_version: RayVersion | None = Field(None, description="the image's Ray (rayVersion)")
    python: str = Field("python", pattern=r"^((/[A-Za-z0-9._+-]+)+|[A-Za-z0-9._+-]+)$",
                        max_length=1024,
                        description="the image's interpreter, for the plan's {python}")
    engine_home: PodPath | None = Field(None, description="the engine's source checkout in the "
                                                          "image, for the plan's {engine_home}")
    head: PodResources = PodResources(cpu="4", memory="16Gi")
    worker: WorkerResources = WorkerResources(cpu="8", memory="64Gi")
    service_account: DnsSubdomain | None = None
    submission_mode: Literal["K8sJobMode", "HTTPMode", "SidecarMode"] = Field(
        "K8sJobMode", description="how KubeRay submits the job (InteractiveMode waits for a "
                                  "submission of one's own, which a plan never makes)")
    ttl_seconds_after_finished: int = Field(
        600, ge=0, le=INT32_MAX,
        description="seconds the finished RayJob and its cluster are kept to read logs")
    active_deadline_seconds: int | None = Field(
        None, ge=1, le=INT32_MAX,
        description="the plan's time limit: KubeRay fails the RayJob after it")
    volume: SharedVolume
    secrets: dict[EnvName, SecretRef] = Field(
        default_factory=dict,
        description="environment variables the engine reads (the plan's env names, e.g. "
                    "WANDB_API_KEY, HF_TOKEN), each from a key of a Secret")

    auth: RayAuth | None = Field(None, description="Ray's token authentication (KubeRay "
                                                   "authOptions); off when left out")

    @field_validator("engine_home")
    @classmethod
    def _normal(cls, value: str | None) -> str | None:
        return None if value is None else _normal_path(value, "engine_home")

    @field_validator("auth")
    @classmethod
    def _ray_takes_tokens(cls, value: RayAuth | None, info: ValidationInfo) -> RayAuth | None:
        """KubeRay refuses the cluster otherwise (ValidateRayClusterSpec): said at plan time,
        not by a RayJob that fails once applied."""
        if value is None:
            return None
        version = info.data.get("ray_version")
        least = ".".join(map(str, TOKEN_AUTH_MIN_RAY))
        if version is None:
            raise ValueError(f"token authentication needs ray_version (the image's Ray, "
                             f"{least} or later): KubeRay refuses the cluster without it")
        if tuple(int(part) for part in version.split(".")) < TOKEN_AUTH_MIN_RAY:
            raise ValueError(f"token authentication needs Ray {least} or later; ray_version "
                             f"is {version}")
        clash = sorted(set(info.data.get("secrets") or {}) & set(TOKEN_AUTH_ENV))
        if clash:
            raise ValueError(f"secrets {', '.join(clash)}: KubeRay sets these itself when auth "
                             "is on; name the token's Secret in auth.secret_name")
        return value

    @field_validator("python")
    @classmethod
    def _interpreter(cls, value: str) -> str:
        return _normal_path(value, "python") if value.startswith("/") else value
