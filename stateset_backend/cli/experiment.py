"""The questions to ask before spending a GPU hour, about one spec on one engine release: can
it run it (``check``), what will every setting become (``explain``), and the reviewable plan
that fixes the launch (``plan``). All three answer from the contract and the spec, without
launching the engine."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from stateset_backend.cli.explain_tables import (
    print_effective,
    print_side_by_side,
    print_upgrade,
)
from stateset_backend.cli.shared import Commands, emit, load_registry, read_spec
from stateset_backend.cli.target import (
    engine_options,
    engine_target,
    engine_version,
    plan_for,
    provider_options,
)

if TYPE_CHECKING:
    from stateset_backend.engines.registry import AdapterEntry
    from stateset_backend.spec.model import ExperimentSpec


COMMANDS = ("check", "explain", "plan")


def add_parsers(commands: Commands) -> None:
    p = commands.add("check", cmd_check, "check an engine version can run a spec: "
                                         "capabilities, every setting's translation, the "
                                         "budget (exit 0, 2 or 3)")
    engine_options(p)
    p.add_argument("spec")
    p = commands.add("explain", cmd_explain, "show what every spec field becomes on an engine")
    engine_options(p, required=False)
    p.add_argument("--all-engines", action="store_true",
                   help="one column per registered engine, side by side")
    p.add_argument("--effective", action="store_true",
                   help="with --all-engines: what each engine will really do, per setting: "
                        "same, pinned, declared or refused")
    p.add_argument("--differs", action="store_true",
                   help="with --effective: only the settings that are not the same "
                        "everywhere by default")
    p.add_argument("--upgrade", metavar="FROM..TO",
                   help="with --engine: what moving this spec from one release to another "
                        "changes (keys, values, defaults, deviations, refusals)")
    p.add_argument("spec")
    p = commands.add("plan", cmd_plan, "make a reviewable launch plan")
    engine_options(p)
    provider_options(p)
    p.add_argument("-o", "--output", help="plan file to write (default: print it)")
    p.add_argument("spec")


def cmd_check(args: argparse.Namespace) -> int:
    from stateset_backend.contracts.capabilities import required_capabilities
    from stateset_backend.contracts.loader import check

    registry = load_registry()
    spec, entry, version = target = engine_target(args, registry)
    report = check(entry.adapter.contract, version, required_capabilities(spec))
    if not report.ok:  # the missing capabilities, as data, before the one-line refusal
        if args.json:
            print(json.dumps(report.to_json(), indent=2))
        report.raise_if_missing()
    # capabilities are not enough: a value the release cannot honour, a deviation refused
    # under equivalence: strict, a budget the data cannot fill are refused by the plan, so
    # `check` answers for the whole plan (made and dropped, nothing written)
    plan = plan_for(args, registry, target)
    deviations = [d.get("deviation") for d in plan.deviations]
    emit(args, {**report.to_json(), "deviations": plan.deviations},
         f"{args.engine} {version} can run this spec ({len(report.required)} capabilities "
         f"required" + (f"; declared deviations: {', '.join(map(str, deviations))}"
                        if deviations else "; no declared deviation") + ")")
    return 0


def _explain_column(entry: AdapterEntry, spec: ExperimentSpec, version: str) -> Any:
    from stateset_backend.contracts.loader import parse_version
    from stateset_backend.translate.effective import column

    adapter = entry.adapter
    dialect = adapter.contract.dialect(parse_version(version))
    with entry.guard("explaining the spec"):
        return column(spec, adapter.name, version, dialect, adapter.rules(dialect))


def cmd_explain(args: argparse.Namespace) -> int:
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.translate.effective import counts, effective_table

    spec = read_spec(args.spec)
    registry = load_registry()
    if args.upgrade is not None:
        return _explain_upgrade(args, spec, registry)
    if args.all_engines == (args.engine is not None):
        raise InvalidInput("explain takes --engine E or --all-engines")
    if args.all_engines and args.engine_version:
        raise InvalidInput("--engine-version needs --engine (--all-engines uses each engine's "
                           "installed or newest known version)")
    if (args.effective or args.differs) and not args.all_engines:
        raise InvalidInput("--effective and --differs compare engines: add --all-engines")
    if args.differs and not args.effective:
        raise InvalidInput("--differs filters the --effective table: add --effective")
    columns = []
    for name in (sorted(registry.adapters) if args.all_engines else [args.engine]):
        entry = registry.get(name)
        if args.all_engines:
            with entry.guard("detecting the installed version"):
                installed = entry.adapter.installed_version(args.python, args.engine_home)
            version = installed or entry.adapter.contract.newest_known_version()
        else:
            version = engine_version(entry, args.engine_version, args.python, args.engine_home)
        columns.append(_explain_column(entry, spec, version))
    def effective() -> dict[str, Any]:
        table = effective_table(columns)
        table["counts"] = counts(table)  # over every setting, whether --differs filters rows
        return table

    if args.effective:
        table = effective()
        if args.differs:
            table = {**table, "rows": [r for r in table["rows"] if not r["same_everywhere"]]}
        emit(args, table, lambda: print_effective(table, args.differs))
        return 0
    engines = [{"engine": c.engine, "engine_version": c.version, "dialect": c.dialect.name,
                "fields": [r.to_json() for r in c.rows]} for c in columns]
    doc: dict[str, Any] = {"engines": engines} if args.all_engines else engines[0]
    emit(args, doc, lambda: print_side_by_side(engines, effective, args.spec))
    return 0


def _explain_upgrade(args: argparse.Namespace, spec: ExperimentSpec, registry: Any) -> int:
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.contracts.loader import parse_version
    from stateset_backend.translate.upgrade import Release, parse_range, upgrade

    if args.engine is None or args.all_engines or args.engine_version or args.effective:
        raise InvalidInput("--upgrade FROM..TO compares two releases of one engine: give "
                           "--engine E alone (no --all-engines, --engine-version or "
                           "--effective)")
    entry = registry.get(args.engine)
    adapter = entry.adapter
    releases = []
    for version in parse_range(adapter.name, args.upgrade):
        dialect = adapter.contract.dialect(parse_version(version))
        with entry.guard("explaining the spec"):
            releases.append(Release(version, dialect, adapter.rules(dialect)))
    with entry.guard("explaining the spec"):
        doc = upgrade(spec, adapter.name, releases[0], releases[1])
    emit(args, doc, lambda: print_upgrade(doc))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from stateset_backend.plan.launch_plan import write_plan

    plan = plan_for(args, load_registry())
    if args.output:
        write_plan(plan, args.output)
        emit(args, {"plan": args.output, "run_id": plan.run_id,
                    "experiment_digest": plan.experiment_digest,
                    "binding_digest": plan.binding_digest, "checksum": plan.checksum},
             f"wrote {args.output} (run {plan.run_id}, {plan.engine} {plan.engine_version})")
    else:
        print(json.dumps(plan.to_json(), indent=2))
    return 0
