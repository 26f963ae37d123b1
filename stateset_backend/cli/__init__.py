"""The ``stateset-backend`` command line.

Every failure is one line on stderr and a documented exit code (0 ok, 2 invalid input,
3 unsupported, 4 engine failed, 5 result invalid, 6 resume impossible, 130 interrupted);
``--json`` adds the detail as JSON on stdout and ``--debug`` shows the traceback. Imports are
deferred into each command so ``--help``, ``validate`` and ``digest`` start fast and never
load an engine or torch. One module per command group, in the order of the pipeline, each
adding its own subcommands; the parser here only assembles them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
from collections.abc import Sequence

from stateset_backend import __version__
from stateset_backend.cli import (
    conformance,
    engines,
    experiment,
    importing,
    publish,
    rehearse,
    run,
    runs,
    spec,
)
from stateset_backend.cli.shared import PROG, Commands, Parser

# the command groups, in the order `--help` lists their commands; each names the top-level
# commands its add_parsers adds (COMMANDS), so that only the owner of the one given is built
GROUPS = (spec, engines, experiment, importing, run, rehearse, runs, publish, conformance)
_OWNER = {name: group for group in GROUPS for name in group.COMMANDS}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; given the command word, only its group's subcommands are added, as pip
    builds only the command it runs: the other groups' parsers (some 120 options, each
    checked through a help formatter) cost every start about 2 ms. An unknown word, or none,
    gets them all, for the listing and for the error that names every choice."""
    # The flags work before or after the subcommand. A subcommand's copy leaves the
    # namespace alone unless given (SUPPRESS), so it never resets what the top level read.
    top = Parser(add_help=False)
    top.add_argument("--json", action="store_true", help="print data as JSON")
    top.add_argument("--debug", action="store_true", help="show tracebacks")
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print data as JSON")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks")

    parser = Parser(prog=PROG, parents=[top],
                    description="Run one backend-neutral RL post-training experiment on any "
                                "engine, and keep its identity.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = Commands(parser.add_subparsers(dest="command", required=True,
                                              parser_class=Parser), common)
    owner = _OWNER.get(command)
    for group in GROUPS if owner is None else (owner,):
        group.add_parsers(commands)
    return parser


def _command_word(raw: list[str]) -> str | None:
    """The command a command line names: its first word after the top-level flags."""
    for token in raw:
        if token not in ("--json", "--debug"):
            return None if token.startswith("-") else token
    return None


# C0 and C1 controls (U+0085 is a line break to splitlines() and terminals; U+009B starts a
# terminal escape) and the Unicode line and paragraph separators
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(message: str) -> str:
    """An error is one line whatever the user's strings in it hold: a newline or other
    control character in a path or name is shown escaped, as Python writes it, and a line
    no one could read (a message quoting a huge value) keeps its start and end; ``--json``
    prints the message and details whole."""
    from stateset_backend.common.display import ERROR_CHARS, elided_line

    return elided_line(_CONTROL.sub(lambda m: repr(m.group())[1:-1], message), ERROR_CHARS)


# The cyclic collector's first threshold for the CLI's own process (700 by default). Starting
# a command builds a few hundred thousand objects that live as long as it does (pydantic's
# validators, rich, the adapters' tables), and at 700 allocations a pass the collector walks
# them again and again to find almost no garbage; mypy raises it for the same reason. It still
# runs, so a command that supervises an engine for hours collects its cycles.
GC_THRESHOLD = (200_000, 30, 30)


def main(argv: Sequence[str] | None = None) -> int:
    from stateset_backend.common.errors import StatesetError

    if argv is None:  # the process is ours: a console script or `python -m`
        gc.set_threshold(*GC_THRESHOLD)
    raw = list(sys.argv[1:] if argv is None else argv)
    debug, as_json = "--debug" in raw, "--json" in raw
    try:
        args = build_parser(_command_word(raw)).parse_args(raw)
        code = int(args.func(args))
    except StatesetError as exc:
        if debug:
            raise
        if as_json:
            print(json.dumps({"error": exc.to_json()}, indent=2))
        print(f"{PROG}: error: {one_line(exc.message)}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:
        # The reader stopped reading (`| head`): a normal way to stop, not an error. Point
        # stdout at /dev/null so the interpreter's final flush cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    except Exception as exc:
        if debug:
            raise
        print(f"{PROG}: internal error: {type(exc).__name__}: {one_line(str(exc))} "
              "(rerun with --debug)",
              file=sys.stderr)
        code = 1
    if argv is None:
        # Exit without the interpreter's last collection walking every object the command
        # built: atexit handlers, waiting threads and the streams' flush still run, and what
        # is freed by reference counting still is; cyclic garbage is left to the OS, as Python
        # never promises to finalize it at exit. Our writes that matter are closed by now.
        gc.freeze()
        sys.exit(code)
    return code
