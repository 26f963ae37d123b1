"""``import``: a team's own engine launch as a spec, with the proof of what it kept.

The launch is read the way its engine reads it, the spec is solved from the adapters' own
rules, and the spec's plan is read back by the same reader: the screen lists every setting of
the launch with its fate, and every difference between the two readings with its reason.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stateset_backend.cli.shared import Commands, emit, load_registry

COMMANDS = ("import",)
ENGINES = ("verl", "openrlhf", "nemo-rl", "trl")


def add_parsers(commands: Commands) -> None:
    p = commands.add("import", cmd_import, "turn an engine launch (a verl script or overrides, "
                                           "an OpenRLHF command line, a NeMo RL YAML, a TRL "
                                           "GRPOConfig file) into a spec, accounting for every "
                                           "setting")
    p.add_argument("engine", help=f"the launch's engine: {', '.join(ENGINES)}")
    p.add_argument("file", help="the launch: a shell script, an overrides file or a config")
    p.add_argument("-o", "--output", help="spec file to write (default: only the screen)")
    p.add_argument("--engine-version", help="the release the launch is for (default: the "
                                            "newest the contract knows)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="NeMo RL: an override given after the config, as on its command line "
                        "(repeatable)")


def cmd_import(args: argparse.Namespace) -> int:
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.importing.launch import import_file

    if args.engine not in ENGINES:
        raise InvalidInput(f"import: engine {args.engine!r} is not one of {', '.join(ENGINES)}")
    source = Path(args.file)
    if not source.is_file():
        raise InvalidInput(f"import: {args.file}: no such file")
    imported = import_file(load_registry(), args.engine, source, args.engine_version,
                           overrides=args.override)
    doc = imported.to_json()
    if args.output:
        from stateset_backend.common.jsonio import atomic_write_json
        from stateset_backend.spec.inputs import rebase_spec_paths

        target = Path(args.output)
        spec = rebase_spec_paths(imported.spec, source.resolve().parent,
                                 target.resolve().parent)
        atomic_write_json(target, spec)
        doc["written"] = str(target)
    emit(args, doc, lambda: _screen(doc, str(source), args.output))
    return 0


def _value(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def _screen(doc: dict[str, Any], source: str, output: str | None) -> None:
    trip = doc["round_trip"]
    if "error" in trip:
        print(f"{doc['engine']} {doc['engine_version']}: {trip['settings']} settings in "
              f"{source}; the imported spec cannot be planned here, so nothing was read back: "
              f"{trip['error']}")
    else:
        print(f"{doc['engine']} {doc['engine_version']}: {trip['settings']} settings in "
              f"{source}; the imported spec's plan, read back as {doc['engine']} reads it, "
              f"reproduces {trip['reproduced']} ({trip['percent']}%)")
        owned = trip["settings"] - trip["experiment_settings"]
        if owned:
            print(f"  {owned} of the others name the run or its output folders, which the hub "
                  f"sets itself; of the remaining {trip['experiment_settings']}, "
                  f"{trip['experiment_reproduced']} ({trip['experiment_percent']}%)")
        whole = trip["whole_configuration"]
        print(f"  of every key {doc['engine']} {doc['engine_version']} reads (the launch's and "
              f"its defaults), {whole['same']} of {whole['keys']} read the same "
              f"({whole['percent']}%)")
    groups = [("mapped", "mapped to the spec"),
              ("engine_option", "kept in engine_options (engine-only, outside the digest)"),
              ("default", f"{doc['engine']}'s own default, restated"),
              ("not_expressible", "not expressible (the plan differs)")]
    for fate, title in groups:
        rows = [s for s in doc["settings"] if s["fate"] == fate]
        if not rows:
            continue
        print(f"\n{title} ({len(rows)}):")
        for s in rows:
            where = f" -> {s['spec_field']}" if s.get("spec_field") else ""
            line = f"  {s['key']} = {_value(s['value'])}{where}"
            if s["reproduced"] is False:
                line += f"; the plan: {_value(s.get('planned'))}"
            if s.get("reason") and fate != "engine_option":
                line += f"  ({s['reason']})"
            print(line)
    if doc["refused"]:
        print(f"\nrefused ({len(doc['refused'])}):")
        for r in doc["refused"]:
            print(f"  {r['given_as']}: {r['reason']}")
    changed = trip["plan_changes_defaults"]
    if changed:
        print(f"\nthe plan also sets {len(changed)} keys the launch left at "
              f"{doc['engine']}'s default:")
        for c in changed:
            why = f" ({c['spec_field']})" if c.get("spec_field") else " (the hub's launch)"
            print(f"  {c['key']}: {_value(c['engine_default'])} -> "
                  f"{_value(c['planned'])}{why}")
    for title, lines in (("inputs", doc["inputs"]), ("notes", doc["notes"])):
        if lines:
            print(f"\n{title}:")
            for line in lines:
                print(f"  {line}")
    print("\n" + (f"wrote {output}" if output else "add -o spec.json to write the spec"))
