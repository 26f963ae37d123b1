"""``check``, ``explain``, ``plan`` and ``run --engine`` all name an engine and a release and
must agree on which release that is: the one asked for, else the one installed where the
engine lives, else a refusal that says where it was looked for and how to install it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateset_backend.cli.shared import read_spec

if TYPE_CHECKING:
    from stateset_backend.engines.registry import AdapterEntry, Registry


def engine_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--engine", required=required, help="engine name (see `engines`)")
    p.add_argument("--engine-version", help="plan for this engine version instead of "
                                            "the installed one")
    p.add_argument("--python", help="interpreter of the environment the engine lives in")
    p.add_argument("--engine-home", help="the engine's source checkout (engines run from "
                                         "one, e.g. NeMo RL)")


def engine_version(entry: AdapterEntry, requested: str | None, python: str | None,
                   home: str | None = None, running: bool = False) -> str:
    from stateset_backend.common.errors import Unsupported
    from stateset_backend.contracts.loader import parse_version

    if requested is not None:
        parse_version(requested)
        return requested
    with entry.guard("detecting the installed version"):
        installed = entry.adapter.installed_version(python, home)
    if installed is None:
        raise Unsupported(_not_installed(entry, python, home, running))
    return installed


def _not_installed(entry: AdapterEntry, python: str | None, home: str | None,
                   running: bool) -> str:
    """Where the engine was looked for, how to install it beside the hub (its own environment,
    as each engine's docs recommend) and the flag that points at it; ``--engine-version`` only
    where it can work (planning for another machine), never for ``run``."""
    contract = entry.adapter.contract
    name, dist = entry.adapter.name, contract.distribution
    newest = contract.newest_known_version()
    where = f"--python {python}" if python else f"--engine-home {home}" if home else \
        "this Python environment"
    if dist is None:
        fix = (f"point --engine-home at a {name} source checkout (a release tag, "
               f"{contract.supported})")
    else:
        venv = f"~/.venvs/{name}"
        fix = (f"install it in its own environment and point --python at it: python -m venv "
               f"{venv} && {venv}/bin/pip install '{dist}=={newest}', then add --python "
               f"{venv}/bin/python (supported: {contract.supported})")
    later = "" if running else "; or pass --engine-version V to plan for a machine that has it"
    return f"{name} is not installed in {where}; {fix}{later}"


def engine_target(args: argparse.Namespace, registry: Registry) -> tuple[Any, Any, str]:
    """The spec, the engine's registry entry and the release a command is asked about."""
    entry = registry.get(args.engine)
    return (read_spec(args.spec), entry,
            engine_version(entry, args.engine_version, args.python, args.engine_home,
                           running=args.command == "run"))


def plan_for(args: argparse.Namespace, registry: Registry,
             target: tuple[Any, Any, str] | None = None) -> Any:
    """The plan ``plan``, ``run --engine`` and ``check`` make (``check`` drops it)."""
    from stateset_backend.plan.launch_plan import make_plan

    spec, entry, version = target or engine_target(args, registry)
    return make_plan(spec, entry, version, provider=getattr(args, "provider", "local"),
                     base_dir=Path(args.spec).resolve().parent)

