"""The command-line option that sets each Slurm setting. ``plan`` and ``run`` add exactly
these options, and an error about a setting names its option from here, so no message can
name an option the command line does not have. Kept apart from the settings model so that
building the parser loads no pydantic."""

from __future__ import annotations

# ray_port and rendezvous_port have no option: each job chooses its own from its id
OPTIONS: dict[str, str] = {
    "shared_root": "--slurm-shared-root",
    "partition": "--slurm-partition",
    "account": "--slurm-account",
    "qos": "--slurm-qos",
    "time_limit": "--slurm-time",
    "cpus_per_task": "--slurm-cpus-per-task",
    "container_image": "--slurm-container-image",
    "checkpoint_warning_s": "--slurm-checkpoint-warning",
    "requeue": "--slurm-requeue",
}
