"""What the queue does with a job before it runs, said to the person waiting for it.

Slurm accepts a job its partition can never start (a time limit above the partition's
``MaxTime``, more nodes than it has) and leaves it pending for ever unless the cluster sets
``EnforcePartLimits``; so the job's own ``#SBATCH`` lines are checked against
``scontrol show partition`` before it is submitted. And a job waiting in the queue looks like
a hang: while it waits, its state and Slurm's reason (``Resources``, ``Priority``,
``PartitionTimeLimit``, ``ReqNodeNotAvail``...) are shown when they change and every half
minute, and a timeout that cancels it says what it was waiting for.
"""

from __future__ import annotations

import re
import sys
import time

from stateset_backend.providers.slurm.flags import OPTIONS
from stateset_backend.providers.slurm.settings import limit_seconds

REPORT_EVERY_S = 30.0
WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "SUSPENDED"})
_DIRECTIVE = re.compile(r"^#SBATCH --([a-z-]+)=(\S+)$", re.MULTILINE)
_FIELD = re.compile(r"(\w+)=(\S*)")
_NO_LIMIT = {"UNLIMITED", "INFINITE", "NONE", ""}


def directives(script: str) -> dict[str, str]:
    """The ``#SBATCH --name=value`` lines of a batch script."""
    return dict(_DIRECTIVE.findall(script))


def partition(listing: str, name: str | None) -> dict[str, str] | None:
    """One partition's fields from ``scontrol show partition -o``: the one named, else the
    default one (where sbatch sends a job that names none)."""
    for line in listing.splitlines():
        fields = dict(_FIELD.findall(line))
        if (name is None and fields.get("Default") == "YES") or \
                (name is not None and fields.get("PartitionName") == name):
            return fields
    return None


def never_starts(script: str, listing: str) -> str | None:
    """Why the partition can never run this job, naming what to change; None when it can
    (or when the partition is unknown: sbatch then refuses it in its own words)."""
    asked = directives(script)
    fields = partition(listing, asked.get("partition"))
    if fields is None:
        return None
    name = fields.get("PartitionName", "?")
    max_time = fields.get("MaxTime", "UNLIMITED")
    limit = limit_seconds(asked["time"]) if "time" in asked else None
    if max_time.upper() not in _NO_LIMIT and limit is not None:
        cap = limit_seconds(max_time)
        if cap is not None and limit > cap:
            return (f"Slurm would never start this job (nothing was submitted): its time limit "
                    f"{asked['time']} ({OPTIONS['time_limit']}) is above partition {name}'s "
                    f"MaxTime {max_time}; plan it with a limit of at most {max_time}")
    nodes = int(asked.get("nodes", "1"))
    caps = [int(v) for k in ("TotalNodes", "MaxNodes") if (v := fields.get(k, "")).isdigit()]
    if caps and nodes > min(caps):
        return (f"Slurm would never start this job (nothing was submitted): it asks for "
                f"{nodes} nodes and partition {name} gives a job at most {min(caps)}; set "
                f"resources.nodes to at most {min(caps)}, or plan for a larger partition "
                f"({OPTIONS['partition']})")
    return None


class PendingReport:
    """Says on stderr what the queue does with the job: each new state or reason at once, and
    while it waits, again every :data:`REPORT_EVERY_S` seconds with how long it has waited."""

    def __init__(self, job_id: str) -> None:
        self.job_id, self.shown, self.last_said = job_id, "", 0.0
        self.started = time.monotonic()
        self.waiting: str | None = None  # "PENDING (Resources)" while the job waits

    def see(self, state: str, reason: str | None) -> None:
        now = time.monotonic()
        what = state.lower() + (f" ({reason})" if reason else "")
        self.waiting = what if state in WAITING else None
        again = self.waiting is not None and now - self.last_said >= REPORT_EVERY_S
        if what == self.shown and not again:
            return
        waited = int(now - self.started)
        since = f", waited {waited // 60}:{waited % 60:02d}" if self.waiting and waited else ""
        print(f"stateset-backend: Slurm job {self.job_id} {what}{since}", file=sys.stderr,
              flush=True)
        self.shown, self.last_said = what, now
