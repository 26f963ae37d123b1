"""What a Slurm plan adds to a launch: its checked settings and the batch script.

Called while the plan is made, so that a setting Slurm would reject, a spec folder the nodes
cannot see, or a multi-node spec an engine cannot spread over nodes is refused before anything
is written, with the option to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stateset_backend.common.display import elided, elided_line
from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.providers.slurm.flags import OPTIONS
from stateset_backend.providers.slurm.script import (
    SCRIPT_FILE,
    ClusterLaunch,
    cpus_per_node,
    render,
)
from stateset_backend.providers.slurm.settings import SlurmSettings


def settings_of(doc: dict[str, Any]) -> SlurmSettings:
    """The settings, or exit 2 naming the first bad one and the option that sets it."""
    try:
        return SlurmSettings.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(elided(str(part)) for part in first["loc"]) or "settings"
        option = OPTIONS.get(str(first["loc"][0])) if first["loc"] else None
        raise InvalidInput(f"slurm {where}" + (f" ({option})" if option else "")
                           + f": {elided_line(first['msg'].removeprefix('Value error, '))}") \
            from None


def plan_files(doc: dict[str, Any], *, run_id: str, engine: str, launch: ClusterLaunch,
               nodes: int, gpus_per_node: int, base_dir: Path,
               processes_per_node: int | None = None) -> tuple[dict[str, Any],
                                                               dict[str, str]]:
    """The settings as the plan records them, and the files the plan adds (the script)."""
    settings = settings_of(doc)
    processes = processes_per_node or gpus_per_node or 1
    if settings.cpus_per_task is not None and settings.cpus_per_task < processes:
        raise InvalidInput(f"slurm cpus_per_task ({OPTIONS['cpus_per_task']}): "
                           f"{settings.cpus_per_task} is fewer than the {processes} processes "
                           f"{engine} starts on each node; give at least {processes}, or leave "
                           f"it out ({cpus_per_node(launch, processes)} is asked for then)")
    if not settings.holds(str(base_dir)):
        raise InvalidInput(f"the spec's folder {base_dir} is not on the shared filesystem "
                           f"{settings.shared_root} (--slurm-shared-root): the nodes could not "
                           "read its data; plan from a folder under it")
    if nodes > 1 and launch == "process":
        raise Unsupported(f"{engine} runs as one process here and cannot spread over "
                          f"{nodes} nodes; set resources.nodes to 1")
    script = render(settings, launch=launch, run_id=run_id, engine=engine, nodes=nodes,
                    gpus_per_node=gpus_per_node, processes_per_node=processes_per_node)
    return settings.model_dump(mode="json"), {SCRIPT_FILE: script}


def check_runs_dir(doc: dict[str, Any], runs_dir: Path) -> None:
    """The run store must be where the nodes write: on the shared filesystem."""
    settings = settings_of(doc)
    if not settings.holds(str(runs_dir.resolve())):
        raise InvalidInput(f"runs directory {runs_dir.resolve()} is not on the shared "
                           f"filesystem {settings.shared_root} of this Slurm plan: the job could "
                           "not write its outputs there; pass --runs-dir under it")


def with_time_limit(doc: dict[str, Any], files: dict[str, str],
                    time_limit: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A plan's settings and script for a later attempt given more (or less) time: the run's
    identity is the experiment, not the queue's limit, so a run cut off by its limit resumes
    with a longer one. The new limit is checked like the plan's (the warning must stay
    shorter) and recorded in the attempt's script, beside the plan's own."""
    settings = settings_of({**doc, "time_limit": time_limit})
    script = files.get(SCRIPT_FILE, "")
    planned = f"#SBATCH --time={doc.get('time_limit')}"
    if planned not in script.splitlines():
        raise InvalidInput(f"this plan's script has no {planned} line to change")
    script = script.replace(
        planned + "\n", f"# this attempt's time limit, given to `run` ({OPTIONS['time_limit']}); "
                        f"the plan's: {doc.get('time_limit')}\n"
                        f"#SBATCH --time={settings.time_limit}\n", 1)
    return settings.model_dump(mode="json"), {**files, SCRIPT_FILE: script}
