"""``check``, ``explain``, ``plan`` and ``run --engine`` all name an engine and a release and
must agree on which release that is: the one asked for, else the one installed where the
engine lives, else a refusal that says where it was looked for and how to install it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateset_backend.cli.shared import read_spec
from stateset_backend.providers.slurm.flags import OPTIONS

if TYPE_CHECKING:
    from stateset_backend.engines.registry import AdapterEntry, Registry


def engine_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--engine", required=required, help="engine name (see `engines`)")
    p.add_argument("--engine-version", help="plan for this engine version instead of "
                                            "the installed one")
    p.add_argument("--python", help="interpreter of the environment the engine lives in")
    p.add_argument("--engine-home", help="the engine's source checkout (engines run from "
                                         "one, e.g. NeMo RL)")


# each Slurm setting's option: its type and help (providers/slurm/flags.py names the option,
# providers/slurm/settings.py says what the setting means)
SLURM_OPTIONS = {
    "shared_root": (str, "the shared filesystem, mounted at the same path on this machine and "
                         "every node (required)"),
    "partition": (str, "sbatch --partition"),
    "account": (str, "sbatch --account"),
    "qos": (str, "sbatch --qos"),
    "time_limit": (str, "sbatch --time, e.g. 04:00:00 (default 01:00:00)"),
    "cpus_per_task": (int, "sbatch --cpus-per-task"),
    "container_image": (str, "run every step in this image (pyxis)"),
    "checkpoint_warning_s": (int, "seconds before the time limit or a pre-emption at which "
                                  "the engine is asked to checkpoint and stop (default 120)"),
    "requeue": (int, "times `run` resumes the run after the cluster stopped it (default 0)"),
}


def provider_options(p: argparse.ArgumentParser) -> None:
    """Where the plan runs: ``plan`` and ``run --engine`` take the same options."""
    p.add_argument("--provider", choices=["local", "ray", "slurm", "kuberay"], default="local")
    p.add_argument("--kuberay-settings", metavar="FILE",
                   help="with --provider kuberay: the RayJob's settings as a JSON object "
                        "(image, namespace, volume, secrets: docs/providers/kuberay.md)")
    slurm = p.add_argument_group("with --provider slurm (docs/providers/slurm.md)")
    for setting, (kind, text) in SLURM_OPTIONS.items():
        slurm.add_argument(OPTIONS[setting], type=kind, help=text, dest=f"slurm_{setting}")


def provider_settings(args: argparse.Namespace) -> dict[str, Any]:
    from stateset_backend.common.errors import InvalidInput

    given = {setting: value for setting in SLURM_OPTIONS
             if (value := getattr(args, f"slurm_{setting}", None)) is not None}
    provider = getattr(args, "provider", "local")
    if given and provider != "slurm":
        raise InvalidInput(f"{', '.join(OPTIONS[s] for s in given)}: Slurm options need "
                           f"--provider slurm (not {provider})")
    if provider == "slurm" and "shared_root" not in given:
        raise InvalidInput("--provider slurm needs --slurm-shared-root: the shared filesystem "
                           "the nodes read the spec's files from and write the run to")
    settings_file = getattr(args, "kuberay_settings", None)
    if (settings_file is not None) != (provider == "kuberay"):
        raise InvalidInput("--provider kuberay needs --kuberay-settings FILE (the RayJob's "
                           "image, namespace, volume and secrets), and only it takes one")
    if settings_file is not None:
        from stateset_backend.common.jsonio import read_json

        doc = read_json(settings_file, what="KubeRay settings")
        if not isinstance(doc, dict):
            raise InvalidInput(f"{settings_file}: KubeRay settings are a JSON object")
        return doc
    return given


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
                     base_dir=Path(args.spec).resolve().parent,
                     provider_settings=provider_settings(args))

