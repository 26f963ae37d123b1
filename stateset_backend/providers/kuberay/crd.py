"""Offline validation of a RayJob manifest against KubeRay's own CRDs, as strict as the cluster.

Three checks, every problem named by its path in the manifest:

1. the CRD's ``versions[name=v1].schema.openAPIV3Schema`` (types, required fields, int32 and
   int64 ranges) with ``openapi-schema-validator``'s OpenAPI 3.0 validator and format checker:
   plain jsonschema ignores ``format``, so a ``ttlSecondsAfterFinished`` of 2**40 would pass;
2. unknown fields, which the schema alone lets through (it never sets
   ``additionalProperties: false``; the API server prunes them silently, or rejects them under
   ``kubectl apply --validate=strict``): a walk that accepts only declared properties, or
   anything under a map's ``additionalProperties``;
3. what the operator itself checks before it acts (its ``ValidateRayJobMetadata`` and
   ``ValidateRayJobSpec``, the parts a generated manifest can reach): the ``submissionMode``
   enum (the CRD has none), the name's length and form, TTL only with shutdown, a positive
   deadline, a container in every pod template, a runtime env that parses as a YAML mapping,
   and for ``authOptions`` (its ``ValidateRayClusterSpec``) a ``rayVersion`` of 2.52.0 or later
   with the token mode, and no Kubernetes-delegated token auth, which a RayJob cannot use.

The ``rayClusterSpec`` is checked against the RayCluster CRD's ``spec`` as well: it is the
schema KubeRay validates the cluster it creates with. The CRDs are KubeRay v1.7.0's, read from
``$STATESET_KUBERAY_CRDS`` or from ``../shared/engines/kuberay/v1.7.0`` beside the repository.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

from stateset_backend.common.display import problems_text
from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.providers.kuberay.manifest import MAX_RAYJOB_NAME
from stateset_backend.providers.kuberay.settings import TOKEN_AUTH_MIN_RAY

CRD_ENV = "STATESET_KUBERAY_CRDS"
KUBERAY_VERSION = "v1.7.0"
RAYJOB_CRD, RAYCLUSTER_CRD = "ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml"
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
KUBERAY_EXTRA = "pip install 'stateset-backend[kuberay]'"


def default_folder() -> Path:
    """``../shared/engines/kuberay/v1.7.0`` beside the repository this package runs from."""
    return Path(__file__).resolve().parents[3].parent / "shared" / "engines" / "kuberay" / \
        KUBERAY_VERSION


def crd_folder() -> Path | None:
    """Where the CRDs are: ``$STATESET_KUBERAY_CRDS`` when set (it must hold them), else the
    shared folder beside the repository when it does; None when neither has them."""
    named = os.environ.get(CRD_ENV)
    if named:
        folder = Path(named)
        if not all((folder / f).is_file() for f in (RAYJOB_CRD, RAYCLUSTER_CRD)):
            raise InvalidInput(f"{CRD_ENV}={named}: holds no {RAYJOB_CRD} and {RAYCLUSTER_CRD} "
                               f"(KubeRay {KUBERAY_VERSION}'s ray-operator/config/crd/bases)")
        return folder
    folder = default_folder()
    return folder if (folder / RAYJOB_CRD).is_file() and (folder / RAYCLUSTER_CRD).is_file() \
        else None


def missing_crds_reason() -> str:
    return (f"the KubeRay {KUBERAY_VERSION} CRDs ({RAYJOB_CRD}, {RAYCLUSTER_CRD}, from "
            "ray-operator/config/crd/bases of the v1.7.0 tag) are not in "
            f"{default_folder()}; put them there or name their folder in ${CRD_ENV}")


@functools.lru_cache(maxsize=4)
def load_schema(path: str) -> dict[str, Any]:
    """The ``v1`` openAPIV3Schema of one CRD file (C YAML loader where built: about 4x faster
    on these 1.4 MB files)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, "rb") as fh:
        crd = yaml.load(fh, Loader=loader)
    try:
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        return dict(version["schema"]["openAPIV3Schema"])
    except (KeyError, TypeError, StopIteration):
        raise InvalidInput(f"{path}: not a CRD with a v1 openAPIV3Schema") from None


def _where(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(manifest)"


def schema_errors(instance: Any, schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Types, required fields and int32/int64 formats, with OpenAPI 3.0's own validator."""
    try:
        from openapi_schema_validator import OAS30Validator, oas30_format_checker
    except ImportError:
        raise Unsupported(f"validating a RayJob needs openapi-schema-validator: "
                          f"{KUBERAY_EXTRA}") from None
    validator = OAS30Validator(schema, format_checker=oas30_format_checker)
    found = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{_where([*prefix.split('.'), *e.absolute_path] if prefix else e.absolute_path)}: "
            f"{e.message}" for e in found]


def unknown_fields(instance: Any, schema: dict[str, Any], path: str = "",
                   top: bool = True) -> list[str]:
    """Paths of fields the schema does not declare (kubectl's --validate=strict)."""
    out: list[str] = []
    if isinstance(instance, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return out
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, value in instance.items():
            where = f"{path}.{key}" if path else str(key)
            if top and key == "metadata":
                continue  # ObjectMeta: checked by the API server and by operator_rules
            if props is not None and key in props:
                out += unknown_fields(value, props[key], where, False)
            elif isinstance(extra, dict):  # a map[string]T
                out += unknown_fields(value, extra, where, False)
            elif props is not None or extra is None or extra is False:
                out.append(where)
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(instance):
            out += unknown_fields(value, schema["items"], f"{path}[{i}]", False)
    return out


def operator_rules(manifest: Any) -> list[str]:
    """What KubeRay's operator refuses although the schema allows it."""
    import yaml

    out: list[str] = []
    if not isinstance(manifest, dict):
        return ["(manifest): not a mapping"]
    if manifest.get("apiVersion") != "ray.io/v1" or manifest.get("kind") != "RayJob":
        out.append("apiVersion/kind: a ray.io/v1 RayJob is expected")
    meta = manifest.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or len(name) > MAX_RAYJOB_NAME or \
            not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        out.append(f"metadata.name: {name!r} is not a DNS-1035 label of at most "
                   f"{MAX_RAYJOB_NAME} characters (KubeRay's limit for a RayJob)")
    spec = manifest.get("spec")
    if not isinstance(spec, dict):
        return [*out, "spec: missing"]
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode not in SUBMISSION_MODES:
        out.append(f"spec.submissionMode: {mode!r} is not one of {', '.join(SUBMISSION_MODES)}")
    if spec.get("ttlSecondsAfterFinished", 0) and not spec.get("shutdownAfterJobFinishes"):
        out.append("spec.ttlSecondsAfterFinished: needs shutdownAfterJobFinishes true")
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline <= 0:
        out.append("spec.activeDeadlineSeconds: must be a positive integer")
    cluster = spec.get("rayClusterSpec")
    if not isinstance(cluster, dict):
        if not spec.get("clusterSelector"):
            out.append("spec.rayClusterSpec: one of rayClusterSpec or clusterSelector must be "
                       "set")
    else:
        groups = [("spec.rayClusterSpec.headGroupSpec", cluster.get("headGroupSpec"))]
        workers = cluster.get("workerGroupSpecs")
        groups += [(f"spec.rayClusterSpec.workerGroupSpecs[{i}]", g)
                   for i, g in enumerate(workers if isinstance(workers, list) else [])]
        for where, group in groups:
            template = group.get("template") if isinstance(group, dict) else None
            pod = template.get("spec") if isinstance(template, dict) else None
            if not isinstance(pod, dict) or not pod.get("containers"):
                out.append(f"{where}.template.spec.containers: needs at least one container")
        out += _auth_rules(cluster)
    runtime = spec.get("runtimeEnvYAML")
    if isinstance(runtime, str) and runtime.strip():
        try:
            parsed = yaml.safe_load(runtime)
        except yaml.YAMLError as exc:
            out.append(f"spec.runtimeEnvYAML: not YAML: {str(exc).splitlines()[0]}")
        else:
            if not isinstance(parsed, dict):
                out.append("spec.runtimeEnvYAML: not a YAML mapping")
    return out


def _auth_rules(cluster: dict[str, Any]) -> list[str]:
    """KubeRay's checks of ``authOptions`` for a RayJob's cluster."""
    auth = cluster.get("authOptions")
    if not isinstance(auth, dict):
        return []
    where = "spec.rayClusterSpec.authOptions"
    out = []
    if auth.get("enableK8sTokenAuth") is True:
        out.append(f"{where}.enableK8sTokenAuth: KubeRay does not support Kubernetes token "
                   "auth for a RayJob")
    if auth.get("mode") == "token":
        least = ".".join(map(str, TOKEN_AUTH_MIN_RAY))
        version = cluster.get("rayVersion")
        found = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?.*", str(version or ""))
        if found is None:
            out.append(f"{where}.mode: token needs spec.rayClusterSpec.rayVersion (Ray {least} "
                       "or later)")
        elif tuple(int(g or 0) for g in found.groups()) < TOKEN_AUTH_MIN_RAY:
            out.append(f"{where}.mode: token needs Ray {least} or later, rayVersion is "
                       f"{version}")
    return out


def problems(manifest: Any, folder: Path) -> list[str]:
    """Every problem the three checks find; empty when the cluster would take the manifest."""
    rayjob = load_schema(str(folder / RAYJOB_CRD))
    found = [*schema_errors(manifest, rayjob), *(f"{p}: unknown field" for p in
                                                 unknown_fields(manifest, rayjob))]
    cluster = manifest.get("spec", {}).get("rayClusterSpec") \
        if isinstance(manifest, dict) and isinstance(manifest.get("spec"), dict) else None
    if isinstance(cluster, dict):
        raycluster = load_schema(str(folder / RAYCLUSTER_CRD))["properties"]["spec"]
        prefix = "spec.rayClusterSpec"
        seen = set(found)
        for line in [*schema_errors(cluster, raycluster, prefix),
                     *(f"{prefix}.{p}: unknown field"
                       for p in unknown_fields(cluster, raycluster, "", False))]:
            if line not in seen:  # the same schema in both CRDs: each problem once
                found.append(line)
                seen.add(line)
    return [*found, *operator_rules(manifest)]


def validate(manifest: Any, folder: Path | None = None) -> str:
    """Raise naming every problem (the first few on the line, all in the details); return
    what the manifest was checked against."""
    folder = folder or crd_folder()
    if folder is None:
        raise Unsupported(missing_crds_reason())
    found = problems(manifest, folder)
    if found:
        raise InvalidInput(f"the RayJob manifest does not validate against KubeRay "
                           f"{KUBERAY_VERSION}'s CRDs: {problems_text(found)}",
                           details={"problems": found})
    return f"KubeRay {KUBERAY_VERSION} CRDs ({RAYJOB_CRD}, {RAYCLUSTER_CRD})"
