"""What the hub knows before any spec is involved: the engines its plugins registered, what
each can do at the installed release, and the JSON Schemas of the documents it reads and
writes, for people and tools that generate or check them."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stateset_backend.cli.shared import Commands, emit, load_registry, rich_console

COMMANDS = ("schema", "engines")


def add_parsers(commands: Commands) -> None:
    p = commands.add("schema", cmd_schema, "print a JSON Schema (spec, plan, result, contract)")
    p.add_argument("name")
    p = commands.add("engines", cmd_engines, "list registered engine adapters")
    p.add_argument("--python", help="detect installed versions in this interpreter")


def cmd_schema(args: argparse.Namespace) -> int:
    from stateset_backend.publish.schemas import packaged

    sys.stdout.write(packaged(args.name))
    return 0


def cmd_engines(args: argparse.Namespace) -> int:
    registry = load_registry()
    rows: list[dict[str, Any]] = []
    for name, entry in sorted(registry.adapters.items()):
        contract = entry.adapter.contract
        try:
            installed = entry.adapter.installed_version(args.python)
        except Exception as exc:  # detection must never hide the listing
            installed = f"error: {exc}"
        rows.append({
            "engine": name, "plugin": entry.plugin, "distribution": entry.distribution,
            "version": entry.version, "engine_distribution": contract.distribution,
            "supported": contract.supported, "installed": installed,
            # hashing a contract's canonical JSON takes milliseconds; only --json shows it
            "contract_digest": contract.digest if args.json else None,
            "capabilities": [{"versions": r.versions, "provides": sorted(r.provides)}
                             for r in contract.capabilities],
        })
    failures = [f.to_json() for f in registry.failures]

    def table() -> None:
        from rich.table import Table
        from rich.text import Text

        from stateset_backend.common.display import elided, elided_line

        t = Table(title="engines")
        for col in ("engine", "plugin", "supported", "installed"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(r["engine"], f"{r['distribution']} {r['version']}", r["supported"],
                      elided_line(r["installed"]) if r["installed"] else "none")
        console = rich_console()
        console.print(t)
        for name, entry in sorted(registry.adapters.items()):
            row = next(r for r in rows if r["engine"] == name)
            console.print(_can_do(entry.adapter.contract, row["installed"]), markup=False)
        for f in failures:  # a plugin's own text, drawn as it is and bounded
            console.print(Text.assemble((f"plugin {elided(f['plugin'])} failed to load:",
                                         "red"), " ", elided_line(f["error"])))

    emit(args, {"engines": rows, "failed_plugins": failures}, table)
    return 0


def _can_do(contract: Any, installed: str | None) -> str:
    """What an engine can do, at the installed release (else the newest the contract knows),
    by family (objectives, KL, aggregation, ...), and what newer releases add."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.contracts.loader import parse_version

    try:
        version = parse_version(installed) if installed else None
    except InvalidInput:  # an unparseable installed version: describe the newest known
        version = None
    at = version if version is not None and contract.supports(version) else \
        parse_version(contract.newest_known_version())
    provided = sorted(contract.provided(at))
    families: dict[str, list[str]] = {}
    for cap in provided:
        family, _, value = cap.partition(":")
        families.setdefault(family if value else "also", []).append(value or cap)
    where = f"{installed} (installed)" if version is not None and at == version else \
        f"{at} (newest known; not installed)"
    parts = [f"{family} {', '.join(values)}" for family, values in families.items()
             if family != "also"] + [f"also {', '.join(families.get('also', []))}"]
    text = f"{contract.engine} {where}: " + "; ".join(parts)
    newest = parse_version(contract.newest_known_version())
    if newest > at:
        added = sorted(set(contract.provided(newest)) - set(provided))
        if added:
            text += f"; {newest} adds {', '.join(added)}"
    return text
