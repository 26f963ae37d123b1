"""What a Slurm plan asks of the cluster, checked before anything is written.

Every value here ends up in an ``#SBATCH`` line of the plan's script, so each is validated to
the characters Slurm itself accepts for it: nothing a user types can add a directive, a
command or a line. Paths are the cluster's: the shared filesystem the run directory, the data
and the model cache live on is named explicitly, and the plan refuses a spec folder outside it
(a path that exists only on the planning machine would fail on the nodes, hours later).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from stateset_backend.providers.slurm.flags import OPTIONS

SlurmName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")]
# MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS: the forms sbatch --time accepts
TimeLimit = Annotated[str, Field(pattern=r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")]
Image = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/@+#-]{0,254}$")]


def limit_seconds(text: str) -> int | None:
    """A ``--time`` value in seconds, read as sbatch reads it; None for no limit (0)."""
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = [*parts, 0, 0][:3]
    else:  # MM, MM:SS, HH:MM:SS
        hours, minutes, seconds = [0, *parts, 0][:3] if len(parts) < 3 else parts
    total = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return total or None


class SlurmSettings(BaseModel):
    """How one plan runs as a Slurm job (``plan --provider slurm``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shared_root: str = Field(description="absolute path of the shared filesystem, the same on "
                                         "the submitting machine and every node: the spec's "
                                         "folder, the run store and the model cache live under it")
    partition: SlurmName | None = None
    account: SlurmName | None = None
    qos: SlurmName | None = None
    time_limit: TimeLimit = Field("01:00:00", description="sbatch --time")
    cpus_per_task: int | None = Field(None, ge=1, le=4096)
    container_image: Image | None = Field(None, description="pyxis --container-image for every "
                                                            "step; the shared root is mounted")
    checkpoint_warning_s: int = Field(
        120, ge=0, le=86400, validate_default=True,  # the default too must fit the limit
        description="Slurm signals the job this long before its time limit or a pre-emption "
                    "(--signal=B:USR1@N); an engine that honours it checkpoints and stops")
    requeue: int = Field(0, ge=0, le=100, description="times `run` resumes the run as a new "
                                                      "attempt after the cluster stopped it")
    # None: chosen per job from its id (providers/slurm/script.py); a number fixes it
    ray_port: int | None = Field(None, ge=1024, le=65533)
    rendezvous_port: int | None = Field(None, ge=1024, le=65535)

    @field_validator("checkpoint_warning_s")
    @classmethod
    def _before_the_limit(cls, value: int, info: ValidationInfo) -> int:
        """A warning at or past the start of the job would ask the engine to stop after its
        first update: refused while planning, not discovered in the job's log."""
        limit = limit_seconds(info.data["time_limit"]) if "time_limit" in info.data else None
        if limit is not None and value >= limit:
            raise ValueError(f"{value} s must be shorter than the time limit "
                             f"{info.data['time_limit']} ({limit} s, {OPTIONS['time_limit']}); "
                             f"lower it or raise the limit")
        return value

    @field_validator("shared_root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError("must be an absolute path without '..'")
        if any(c in value for c in "\n\r\t\0") or any(ord(c) < 32 for c in value):
            raise ValueError("must not hold control characters")
        return str(path)

    def holds(self, path: str) -> bool:
        """Whether ``path`` lies on the shared filesystem."""
        return PurePosixPath(path).is_relative_to(self.shared_root)
