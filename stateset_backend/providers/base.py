"""Where the engine's process runs: a provider takes a filled-in argv and returns how it ended.

The engine (what trains) and the provider (where compute comes from) are separate choices: the
same plan runs as a local process group or as a Ray job. Both stream the engine's output into
the attempt's log files and stop the whole engine on Ctrl-C, SIGTERM or the timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stateset_backend.providers.local import STDERR_LOG, STDOUT_LOG, Exit, NotStarted, run_local

# A cluster provider's request that the engine checkpoint and stop at the end of its current
# update (the warning before a time limit or a pre-emption): this file, created in the run
# directory. An engine that honours it exits with the run resumable from that checkpoint.
STOP_REQUEST = "stop-requested"
EXIT_STOPPED = 75  # the engine's status after it stopped on that request (EX_TEMPFAIL)

# The providers that start a launch once on every node of their allocation, each copy meeting
# the others at a rendezvous (Slurm: one torchrun agent per node, the ``torchrun`` layout of
# its batch script). The others start the launch on one machine: the local provider as a
# process group here, the Ray provider as one job entry point. An engine whose launch must run
# on every node (the native engine's torchrun across ``resources.nodes``) needs one of these.
PROVIDERS_ACROSS_NODES = frozenset({"slurm"})


# Told (attempt directory, provider, job id) once a cluster has accepted an attempt's job: the
# run store records the attempt as in flight, so listings show it while it waits and runs,
# before it has a result. A list the caller fills, because providers know nothing of the store.
SUBMITTED: list[Callable[[Path, str, str], None]] = []


def announce_submitted(run_dir: Path, provider: str, job: str) -> None:
    """Tell whoever listens that the job was accepted; a listener's failure (a store it cannot
    write) costs the listing its line, never the attempt."""
    for listener in SUBMITTED:
        try:
            listener(run_dir, provider, job)
        except Exception:  # the job runs whatever the listing knows
            continue


@dataclass(frozen=True)
class PreparedLaunch:
    """An attempt ready to start: placeholders filled, files written, resume applied."""

    argv: list[str]
    run_dir: Path
    env: dict[str, str]  # the whole environment for a local process
    set_env: dict[str, str]  # only what the plan sets, for a remote job
    submission_id: str
    echo_stderr: bool

    @property
    def stdout_path(self) -> Path:
        return self.run_dir / STDOUT_LOG

    @property
    def stderr_path(self) -> Path:
        return self.run_dir / STDERR_LOG


class Provider(Protocol):
    """Runs one prepared launch to its end."""

    def launch(self, prepared: PreparedLaunch, timeout: float | None) -> Exit: ...


class LocalProvider:
    """A child process in its own process group, argv without a shell."""

    def launch(self, prepared: PreparedLaunch, timeout: float | None) -> Exit:
        try:
            return run_local(prepared.argv, cwd=prepared.run_dir, env=prepared.env,
                             timeout=timeout, echo_stderr=prepared.echo_stderr,
                             stdout_path=prepared.stdout_path,
                             stderr_path=prepared.stderr_path, **self._extra())
        except NotStarted as exc:  # an attempt like any other: it ends with its result
            return Exit(127, started=False, reason=exc.message)

    def _extra(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class RayProvider:
    """A Ray job through the Jobs API; the attempt directory must be reachable from the
    cluster's workers."""

    address: str | None

    def launch(self, prepared: PreparedLaunch, timeout: float | None) -> Exit:
        from stateset_backend.providers.ray_jobs import run_ray

        return run_ray(prepared.argv, address=self.address, env=prepared.set_env,
                       submission_id=prepared.submission_id, timeout=timeout,
                       stdout_path=prepared.stdout_path, stderr_path=prepared.stderr_path)


def cancelled_exit(cancelled_by: str, what: str) -> Exit:
    """How an attempt ended that ``run`` itself stopped on a cluster: by the run's timeout
    (a failure, timed out) or by the signal named (Ctrl-C or SIGTERM: interrupted); ``what``
    says what was done to the job ("cancelled the job (scancel)", "deleted the RayJob")."""
    if cancelled_by == "timeout":
        return Exit(124, timed_out=True, reason=f"the run's timeout {what}")
    return Exit(130, interrupted=True, reason=f"{cancelled_by} {what}")
