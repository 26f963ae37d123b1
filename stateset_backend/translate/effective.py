"""What one spec really does on every engine: the effective value of each setting, side by side.

The experiment digest promises that two runs with the same digest ran the same experiment. This
table is how a user checks that promise before spending GPU-days: per setting and engine, the
state is ``same`` (the engine's own default already equals the spec, and the launch pins it
anyway), ``pinned`` (the launch changes the engine from its default to the spec's value, or
the hub's own shim or check enforces it),
``declared`` (the engine hard-codes another value, named and quantified by its contract) or
``refused`` (the engine cannot run the spec as written). Leaves the spec makes moot are
``inert`` everywhere alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stateset_backend.contracts.loader import Dialect
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.rules import FieldRow, explain_rows


@dataclass(frozen=True)
class EngineColumn:
    engine: str
    version: str
    dialect: Dialect
    rows: list[FieldRow]


def cell_state(row: FieldRow, dialect: Dialect) -> str:
    """``pinned`` when the launch moves at least one engine key away from the default the
    dialect records for it, or when the hub's own shim, launcher or file check holds the value
    (without the launch it would not hold); ``same`` when the engine's own code already does
    the spec's value, or none of the keys it sets has a recorded default that differs (an
    engine that takes the spec's own vocabulary, like the native one, has no defaults of its
    own to differ from)."""
    if row.state != "pinned":
        return row.state
    if row.hub_enforced:
        return "pinned"
    defaults = {key.lstrip("+"): value for key, value in dialect.defaults.items()}
    for key, value in row.native.items():
        bare = key.lstrip("+")
        if bare in defaults and defaults[bare] != value:
            return "pinned"
    return "same"


def engine_defaults(row: FieldRow, dialect: Dialect) -> dict[str, Any]:
    defaults = {key.lstrip("+"): value for key, value in dialect.defaults.items()}
    return {key: defaults[key.lstrip("+")] for key in row.native if key.lstrip("+") in defaults}


def column(spec: ExperimentSpec, engine: str, version: str, dialect: Dialect,
           rules: Any) -> EngineColumn:
    return EngineColumn(engine, version, dialect, explain_rows(spec, rules, dialect, engine))


def effective_table(columns: list[EngineColumn]) -> dict[str, Any]:
    """The table as data: one row per spec leaf, one cell per engine, each with its state."""
    rows: list[dict[str, Any]] = []
    for i, first in enumerate(columns[0].rows):
        cells: dict[str, Any] = {}
        for col in columns:
            row = col.rows[i]
            cell: dict[str, Any] = {"state": cell_state(row, col.dialect),
                                    "effective": row.effective}
            if row.native:
                cell["native"] = row.native
                defaults = engine_defaults(row, col.dialect)
                if defaults:
                    cell["engine_default"] = defaults
            if row.reason:
                cell["reason"] = row.reason
            if row.deviation_name is not None:
                cell["deviation"] = row.deviation_name
            cells[col.engine] = cell
        states = {c["state"] for c in cells.values()}
        # every engine runs what the spec says: its default agrees, the launch pins it, or
        # the spec makes it moot; only a declared deviation or a refusal makes a difference
        rows.append({"field": first.path, "value": first.value, "cells": cells,
                     "same_everywhere": not states & {"declared", "refused"}})
    return {"engines": [{"engine": c.engine, "engine_version": c.version,
                         "dialect": c.dialect.name} for c in columns],
            "rows": rows}


def counts(table: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per engine, how many settings are in each state (for the README and closing notes)."""
    out: dict[str, dict[str, int]] = {}
    for row in table["rows"]:
        for engine, cell in row["cells"].items():
            bucket = out.setdefault(engine, {})
            bucket[cell["state"]] = bucket.get(cell["state"], 0) + 1
    return out
