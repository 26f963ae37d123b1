"""The conformance kit tells an adapter's author whether an engine does what its contract
claims. Its ``--json`` may name a file for the report, so the command declares its own
``--json`` and ``--debug`` instead of taking the shared ones."""

from __future__ import annotations

import argparse
import json

from stateset_backend.cli.shared import Commands, load_registry

COMMANDS = ("conformance",)


def add_parsers(commands: Commands) -> None:
    p = commands.sub.add_parser("conformance",
                                help="run the adapter conformance kit for an engine",
                                description="run the adapter conformance kit for a registered "
                                            "engine (exit 0, or 5 when a check failed), or "
                                            "print the compatibility matrix")
    p.set_defaults(func=cmd_conformance)
    p.add_argument("engine", nargs="*", metavar="ENGINE")
    p.add_argument("--engine-version", action="append", metavar="V",
                   help="check this version (repeatable; default: every dialect's first, "
                        "and the installed release where the kit can run the engine)")
    p.add_argument("--python", metavar="PY",
                   help="the interpreter of the engine's own environment: the kit runs the "
                        "engine there where it can run on this machine")
    p.add_argument("--json", nargs="?", const="-", metavar="REPORT", default=argparse.SUPPRESS,
                   help="write the report as JSON to REPORT (stdout without a path)")
    p.add_argument("--matrix", action="store_true",
                   help="print the compatibility matrix (Markdown) of the built-in engines")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show tracebacks")


def cmd_conformance(args: argparse.Namespace) -> int:
    """The conformance kit for one registered engine (exit 0, or 5 when a check failed), or
    the compatibility matrix of the built-in engines (or the engines named) as Markdown."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.conformance import runner

    registry = load_registry()
    if args.matrix:
        from stateset_backend.conformance.matrix import render

        names = args.engine or sorted(n for n, e in registry.adapters.items()
                                      if e.plugin == "builtin")
        print(render([registry.get(name) for name in names]), end="")
        return 0
    if len(args.engine) != 1:
        raise InvalidInput("conformance: name one ENGINE (or pass --matrix)")
    report = runner.run_conformance(registry.get(args.engine[0]), args.engine_version,
                                    python=args.python)
    if args.json in ("-", True):  # True: the top-level --json
        print(json.dumps(report, indent=2))
    else:
        if args.json:
            runner.write_json(report, args.json)
        print(runner.render_text(report))
    # a check that saw nothing of what the engine reads cannot pass
    return runner.FAILED_EXIT if report["counts"]["failed"] or \
        report["counts"].get("unverified") else 0
