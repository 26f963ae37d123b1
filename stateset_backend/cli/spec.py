"""The commands that need the spec alone: no engine, registry or run store, so they start
fast and work on a machine where no engine is installed."""

from __future__ import annotations

import argparse

from stateset_backend.cli.shared import Commands, emit, read_spec

COMMANDS = ("validate", "digest")


def add_parsers(commands: Commands) -> None:
    p = commands.add("validate", cmd_validate, "check a spec; every problem as path: message")
    p.add_argument("spec")
    p = commands.add("digest", cmd_digest, "print the experiment digest of a spec")
    p.add_argument("spec")


def cmd_validate(args: argparse.Namespace) -> int:
    from stateset_backend.spec.digest import experiment_digest

    spec = read_spec(args.spec)
    digest = experiment_digest(spec)
    emit(args, {"valid": True, "experiment_digest": digest}, f"{args.spec}: valid ({digest})")
    return 0


def cmd_digest(args: argparse.Namespace) -> int:
    from stateset_backend.spec.digest import experiment_digest

    digest = experiment_digest(read_spec(args.spec))
    emit(args, {"experiment_digest": digest}, digest)
    return 0
