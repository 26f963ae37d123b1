"""Identity: experiment digest, binding digest and plan checksum.

All three hash RFC 8785 (JCS) canonical JSON, so key order, whitespace and ``1`` vs ``1.0``
never change an identity, and any other tool that implements JCS can recompute them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

from stateset_backend.spec.model import (
    ABSENT_WHEN_NULL,
    NON_IDENTITY_FIELDS,
    SPEC_SCHEMA_ID,
    ExperimentSpec,
)


def canonical_json(doc: Any) -> bytes:
    return rfc8785.dumps(doc)


def sha256_of(doc: Any) -> str:
    """``sha256:<hex>`` of a JSON document's canonical form."""
    return "sha256:" + hashlib.sha256(canonical_json(doc)).hexdigest()


def identity_document(spec: ExperimentSpec) -> dict[str, Any]:
    """The normalized spec that the experiment digest covers.

    Defaults are filled (by validation), non-identity sections are removed, and the schema id
    is included so that a future spec version can never collide with this one.
    """
    doc = spec.model_dump(mode="json", exclude=set(NON_IDENTITY_FIELDS))
    for section, key in ABSENT_WHEN_NULL:
        if doc[section][key] is None:
            del doc[section][key]
    return {"schema": SPEC_SCHEMA_ID, "experiment": doc}


def experiment_digest(spec: ExperimentSpec) -> str:
    return sha256_of(identity_document(spec))


def binding_digest(
    *,
    experiment_digest: str,
    engine: str,
    engine_version: str,
    adapter_distribution: str,
    adapter_version: str,
    contract_digest: str,
    resources: dict[str, Any],
    engine_options: dict[str, Any],
    native: dict[str, Any],
) -> str:
    """Identify one concrete launch: the same experiment bound to one engine build."""
    return sha256_of({
        "experiment_digest": experiment_digest,
        "engine": engine,
        "engine_version": engine_version,
        "adapter": {"distribution": adapter_distribution, "version": adapter_version},
        "contract_digest": contract_digest,
        "resources": resources,
        "engine_options": engine_options,
        "native": native,
    })


def plan_checksum(plan_doc: dict[str, Any]) -> str:
    """SHA-256 of the plan without its own checksum field."""
    body = {k: v for k, v in plan_doc.items() if k != "checksum"}
    return sha256_of(body)
