"""Every command reports, prints and reads the same way, so none of them has its own idea of
an error, of ``--json`` or of a closed pipe: one parser class turns bad arguments into the one
line and exit code 2 every error gets, one printer answers ``--json``, one console survives
``| head``. Nothing here imports an engine or rich until a command asks."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from stateset_backend.engines.registry import Registry
    from stateset_backend.runs.store import RunStore
    from stateset_backend.spec.model import ExperimentSpec

PROG = "stateset-backend"
RUNS_DIR_HELP = "run store (default ./runs or $STATESET_BACKEND_RUNS_DIR)"

Handler = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line with exit code 2, like every error."""

    def error(self, message: str) -> NoReturn:
        from stateset_backend.common.errors import InvalidInput

        command = self.prog.removeprefix(PROG).strip()  # main adds the program's name
        raise InvalidInput(f"{command}: {message}" if command else message)


class Commands:
    """Where a command group adds its subcommands: each gets the shared ``--json`` and
    ``--debug`` flags, its help as its description, and the handler that runs it."""

    def __init__(self, sub: argparse._SubParsersAction[Parser],
                 common: Parser) -> None:
        self.sub = sub
        self.common = common

    def add(self, name: str, func: Handler, help_: str) -> argparse.ArgumentParser:
        p = self.sub.add_parser(name, parents=[self.common], help=help_, description=help_)
        p.set_defaults(func=func)
        return p


def emit(args: argparse.Namespace, doc: Any, text: str | Callable[[], None]) -> None:
    """Print data as JSON (``--json``) or for humans (a string or a rich renderer)."""
    if args.json:
        print(json.dumps(doc, indent=2))
    elif callable(text):
        text()
    else:
        print(text)


def rich_console() -> Any:
    from rich.console import Console

    class PipeConsole(Console):
        """rich exits 1 on a closed pipe; hand it to main, which treats it as a normal end."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    console = PipeConsole(soft_wrap=False)
    if console.color_system is None:
        # a pipe or a log: nothing is coloured, and the highlighter's patterns over every
        # line of prose were a third of drawing explain's notes, for the same bytes
        console = PipeConsole(soft_wrap=False, highlight=False)
    return console


def read_spec(path: str) -> ExperimentSpec:
    from stateset_backend.spec.files import load_spec

    return load_spec(path)


def load_registry() -> Registry:
    from stateset_backend.engines.registry import build_registry

    return build_registry()


def store_and_run(args: argparse.Namespace) -> tuple[RunStore, str]:
    """The run store a command reads and the run it names (an id, or the unique prefix a
    listing shows)."""
    from stateset_backend.runs.store import RunStore, runs_dir_from

    store = RunStore(runs_dir_from(args.runs_dir))
    return store, store.resolve_run(args.run)
