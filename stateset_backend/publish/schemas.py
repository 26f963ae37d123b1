"""JSON Schemas of the four documents, generated from their pydantic models.

The checked-in files under ``stateset_backend/schemas/`` are what other tools (and plugin
authors) read; a test fails when a model and its file drift. Regenerate with
``python -m stateset_backend.publish.schemas``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput

NAMES = ("spec", "plan", "result", "contract")


def generate(name: str) -> dict[str, Any]:
    """Build a schema from its model (imports pydantic models; not on the CLI's fast path)."""
    from pydantic import BaseModel

    from stateset_backend.contracts.loader import CONTRACT_SCHEMA_ID, Contract
    from stateset_backend.plan.launch_plan import PLAN_SCHEMA_ID, LaunchPlan
    from stateset_backend.runs.results import RESULT_SCHEMA_ID, Result
    from stateset_backend.spec.model import SPEC_SCHEMA_ID, ExperimentSpec

    models: dict[str, tuple[type[BaseModel], str]] = {
        "spec": (ExperimentSpec, SPEC_SCHEMA_ID), "plan": (LaunchPlan, PLAN_SCHEMA_ID),
        "result": (Result, RESULT_SCHEMA_ID), "contract": (Contract, CONTRACT_SCHEMA_ID)}
    model, schema_id = models[name]
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": schema_id,
            **schema}


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def packaged(name: str) -> str:
    """The checked-in schema text, as shipped in the wheel: a plain file beside the package's
    ``__init__`` (the wheel installs as files), read without ``importlib.resources``, whose
    import alone is most of this command's time."""
    from stateset_backend import schemas

    if name not in NAMES:
        raise InvalidInput(f"unknown schema {name!r} (one of: {', '.join(NAMES)})")
    return Path(schemas.__file__).with_name(f"{name}.json").read_text(encoding="utf-8")


def write_all(directory: Path) -> None:
    for name in NAMES:
        (directory / f"{name}.json").write_text(render(generate(name)), encoding="utf-8")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        Path(__file__).resolve().parent.parent / "schemas"
    write_all(target)
    print(f"wrote {len(NAMES)} schemas to {target}")
