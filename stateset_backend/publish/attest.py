"""Provenance: an in-toto Statement v1 that binds an attempt's files to the experiment that
made them, for supply-chain tools (cosign, witness, policy engines) to sign and check.

The subjects are the attempt's artifacts with the sha256 recorded when the run finished; each
file is hashed again first, and a file that is missing or no longer matches is refused (exit
5) rather than attested. The predicate (type :data:`PREDICATE_TYPE`) holds the identity
(experiment and binding digests, plan checksum, contract digest), the engine and adapter
releases, the status, every result check, the declared deviations and the selection.

The statement is built and validated by the in-toto project's own ``in_toto_attestation``
library (imported only here). Its protobuf ``Struct`` holds every number as a double, so the
document written keeps the original JSON numbers; it is parsed back by the library and
checked to be the same statement before it is returned. The statement is not signed: signing
is the job of the tool that holds the key (e.g. ``cosign attest-blob``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stateset_backend import __version__
from stateset_backend.common.display import problems_text
from stateset_backend.common.errors import InvalidResult, Unsupported
from stateset_backend.common.jsonio import atomic_write_bytes
from stateset_backend.runs.attempts import AttemptRecord
from stateset_backend.spec.content import sha256_file

PREDICATE_TYPE = "https://stateset.dev/attestation/run/v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"


def verify_artifacts(record: AttemptRecord) -> None:
    """Every recorded artifact is still a regular file inside the attempt with its hash."""
    root = record.directory.resolve()
    faults = []
    for art in record.result.artifacts:
        path = record.directory / art.path
        if Path(art.path).is_absolute() or ".." in Path(art.path).parts or \
                not path.resolve().is_relative_to(root):
            faults.append(f"{art.path}: outside the attempt directory")
        elif path.is_symlink() or not path.is_file():
            faults.append(f"{art.path}: missing" if not path.is_symlink() else
                          f"{art.path}: now a symbolic link")
        elif sha256_file(path) != art.sha256:
            faults.append(f"{art.path}: sha256 no longer matches the recorded {art.sha256}")
    if faults:
        raise InvalidResult(f"run {record.run_id} attempt {record.result.attempt}: "
                            f"{len(faults)} artifact(s) changed since the run; not attested: "
                            + problems_text(faults, shown=5), details={"faults": faults})
    if not record.result.artifacts:
        raise InvalidResult(f"run {record.run_id} attempt {record.result.attempt} recorded no "
                            "artifacts: a statement needs at least one subject")


def subjects(record: AttemptRecord) -> list[dict[str, Any]]:
    return [{"name": a.path, "digest": {"sha256": a.sha256},
             "annotations": {"kind": a.kind, "step": a.step, "bytes": a.bytes}}
            for a in record.result.artifacts]


def predicate(record: AttemptRecord) -> dict[str, Any]:
    r, plan = record.result, record.plan
    result_file = record.directory / "result.json"
    return {
        "run": {"run_id": r.run_id, "attempt": r.attempt, "status": r.status,
                "exit_code": r.exit_code, "started_at": r.started_at, "ended_at": r.ended_at,
                "provider": r.provider, "committed_updates": r.committed_updates,
                "planned_updates": r.planned_updates},
        "experiment_digest": r.experiment_digest,
        "binding_digest": r.binding_digest,
        "plan_checksum": r.plan_checksum,
        "contract_digest": plan.get("contract_digest"),
        "engine": {"name": r.engine, "version": r.engine_version},
        "adapter": plan.get("adapter"),
        "seed": (plan.get("spec") or {}).get("seed"),
        "checks": [c.model_dump(mode="json") for c in r.checks],
        "deviations": r.deviations,
        "selection": r.selection,
        "result": {"path": "result.json",
                   "sha256": sha256_file(result_file) if result_file.is_file() else None},
        "producer": {"name": "stateset-backend", "version": __version__},
    }


def statement(record: AttemptRecord) -> dict[str, Any]:
    """The in-toto Statement v1 of one attempt, validated by the in-toto library."""
    try:
        from google.protobuf import json_format
        from in_toto_attestation.v1 import statement_pb2
        from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
        from in_toto_attestation.v1.statement import Statement
    except ImportError:
        raise Unsupported("writing an attestation needs in-toto-attestation: pip install "
                          "'stateset-backend[attest]'") from None
    verify_artifacts(record)
    subs, pred = subjects(record), predicate(record)
    built = Statement([ResourceDescriptor(name=s["name"], digest=s["digest"],
                                          annotations=s["annotations"]).pb for s in subs],
                      PREDICATE_TYPE, pred)
    built.validate()
    doc = {"_type": STATEMENT_TYPE, "subject": subs, "predicateType": PREDICATE_TYPE,
           "predicate": pred}
    # What is written must be what the library built and validated.
    reread = Statement.copy_from_pb(json_format.ParseDict(json.loads(json.dumps(doc)),
                                                          statement_pb2.Statement()))
    reread.validate()
    if json_format.MessageToDict(reread.pb) != json_format.MessageToDict(built.pb):
        raise AssertionError("the statement document differs from the validated statement")
    return doc


def attest(record: AttemptRecord, output: str | Path | None = None) -> dict[str, Any]:
    """Build the statement; write it to ``output`` when given."""
    doc = statement(record)
    if output is not None:
        atomic_write_bytes(output, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
    return doc
