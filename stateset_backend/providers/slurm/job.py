"""Submitting a prepared launch as a Slurm job and following it to its end.

Slurm is driven through its own command-line tools with machine-readable output
(``sbatch --parsable``, ``scontrol show job -o``, ``sacct``): they are stable across Slurm
releases, where the C API's Python bindings must match the cluster's exact version.
The job writes the attempt's ``stdout.log`` and ``stderr.log`` itself (the run directory is on
the shared filesystem); the provider echoes the engine's stderr while it follows the job, so
the terminal shows the same progress as a local run. Ctrl-C, SIGTERM or the plan's timeout
cancel the job with ``scancel``: a job is never left running unseen.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import EngineFailed, StatesetError, Unsupported
from stateset_backend.providers.base import (
    EXIT_STOPPED,
    STOP_REQUEST,
    PreparedLaunch,
    announce_submitted,
    cancelled_exit,
)
from stateset_backend.providers.local import Exit, forward_interrupts
from stateset_backend.providers.slurm.queue import PendingReport, never_starts
from stateset_backend.providers.slurm.script import ARGV_FILE, ENV_FILE, SCRIPT_FILE

POLL_SECONDS = 0.5
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
# what each end state means for the attempt, in the words the result records
MEANING = {
    "TIMEOUT": "Slurm ended the job at its time limit",
    "PREEMPTED": "Slurm pre-empted the job",
    "NODE_FAIL": "a node of the job failed",
    "OUT_OF_MEMORY": "the job ran out of memory",
    "BOOT_FAIL": "a node of the job failed to boot",
    "DEADLINE": "the job passed its deadline",
    "CANCELLED": "the job was cancelled outside this run",
}
_FIELD = re.compile(r"(\w+)=(\S*)")
SLURM_INSTALL = ("the Slurm client commands (sbatch, squeue, scontrol, scancel) are not on "
                 "PATH: run on a login node of the cluster, or install them (Debian: apt-get "
                 "install slurm-client) with the cluster's slurm.conf")


@dataclass(frozen=True)
class JobState:
    state: str
    exit_code: int | None  # the batch script's status; None while unknown
    signal: int | None = None
    reason: str | None = None


class Refused(EngineFailed):
    """Slurm would not take the job: the attempt never started, and records why."""


def said(done: subprocess.CompletedProcess[str]) -> str:
    """What a Slurm tool printed, as one line: its own words, each line once."""
    lines = [" ".join(line.split()) for line in (done.stderr or done.stdout).splitlines()]
    return "; ".join(dict.fromkeys(line for line in lines if line)) or \
        f"no message (exit {done.returncode})"


def _tool(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise Unsupported(SLURM_INSTALL)
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise EngineFailed(f"{argv[0]} failed ({done.returncode}): {said(done)}")
    return done


def _slurm_path(path: Path) -> str:
    """A path for sbatch's --output/--error, where ``%`` starts a filename pattern."""
    return str(path).replace("%", "%%")


def submit(prepared: PreparedLaunch) -> str:
    """Write the launch's argv and environment beside the script and submit it; the job id."""
    run_dir = prepared.run_dir
    for rel, items in ((ARGV_FILE, prepared.argv),
                       (ENV_FILE, [f"{k}={v}" for k, v in prepared.set_env.items()])):
        if any("\0" in item for item in items):
            raise EngineFailed(f"{rel}: a launch item holds a NUL byte")
        path = run_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(item.encode("utf-8") + b"\0" for item in items))
    done = _tool("sbatch", "--parsable", f"--chdir={run_dir}",
                 f"--output={_slurm_path(prepared.stdout_path)}",
                 f"--error={_slurm_path(prepared.stderr_path)}",
                 str(run_dir / SCRIPT_FILE), check=False)
    if done.returncode != 0:
        raise Refused(f"Slurm refused the job: {said(done)}")
    job_id = done.stdout.strip().split(";")[0]  # "id" or "id;cluster"
    if not job_id.isdigit():
        raise Refused(f"sbatch printed {done.stdout.strip()!r}, not a job id")
    return job_id


def _exit_code(text: str) -> tuple[int | None, int | None]:
    """Slurm's ``code:signal`` pair."""
    code, _, sig = text.partition(":")
    return (int(code) if code.isdigit() else None, int(sig) if sig.isdigit() else None)


def job_state(job_id: str) -> JobState | None:
    """The job as the controller knows it, or as the accounting/completion log recorded it
    once the controller has forgotten it (``MinJobAge``); None while neither knows it."""
    done = _tool("scontrol", "show", "job", "-o", job_id, check=False)
    fields = dict(_FIELD.findall(done.stdout)) if done.returncode == 0 else {}
    if fields.get("JobState"):
        code, sig = _exit_code(fields.get("ExitCode", ""))
        reason = fields.get("Reason")
        return JobState(fields["JobState"], code, sig, None if reason == "None" else reason)
    for argv in (("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"),
                 ("sacct", "-c", "-n", "-P", "-j", job_id, "-o", "State,ExitCode")):
        if shutil.which("sacct") is None:
            break
        rows = [r for r in _tool(*argv, check=False).stdout.splitlines() if "|" in r]
        if rows:
            state, exit_code = rows[-1].split("|")[:2]
            code, sig = _exit_code(exit_code)
            return JobState(state.split()[0], code, sig)
    return None


class _Echo:
    """Copies what the job appends to a log file to the terminal while it runs."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path, self.enabled, self.offset = path, enabled, 0

    def pump(self) -> None:
        if not self.enabled or not self.path.is_file():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        if chunk:
            self.offset += len(chunk)
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()


def follow(job_id: str, prepared: PreparedLaunch, timeout: float | None) -> Exit:
    """Wait for the job's end state, echoing its stderr; cancel it on Ctrl-C, SIGTERM or the
    timeout and wait until Slurm confirms it ended."""
    stop = threading.Event()
    cancelled_by: list[str] = []

    def on_signal(signum: int, frame: Any) -> None:
        cancelled_by.append(signal.Signals(signum).name)
        stop.set()

    echo = _Echo(prepared.stderr_path, prepared.echo_stderr)
    report = PendingReport(job_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    state: JobState | None = None
    with forward_interrupts(on_signal):
        while True:
            echo.pump()
            state = job_state(job_id)
            if state is not None:
                report.see(state.state, state.reason)
            if state is not None and state.state in ENDED:
                break
            timed_out = deadline is not None and time.monotonic() > deadline
            if stop.is_set() or timed_out:
                if timed_out:
                    cancelled_by.append("timeout")
                _tool("scancel", job_id, check=False)
                state = _wait_ended(job_id)
                break
            stop.wait(POLL_SECONDS)
    echo.pump()
    return to_exit(state, prepared.run_dir, cancelled_by, report.waiting)


def _wait_ended(job_id: str, limit_s: float = 120.0) -> JobState | None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        state = job_state(job_id)
        if state is not None and state.state in ENDED:
            return state
        time.sleep(POLL_SECONDS)
    return None


def to_exit(state: JobState | None, run_dir: Path, cancelled_by: list[str],
            waiting: str | None = None) -> Exit:
    """The attempt's end, from how Slurm says the job ended; ``waiting`` is the queue state
    the job was last seen in when it never started ("pending (Resources)")."""
    if cancelled_by:
        queued = f" while it was still {waiting} in the queue" if waiting else ""
        return cancelled_exit(cancelled_by[0], f"cancelled the job (scancel){queued}")
    if state is None:
        return Exit(1, reason="Slurm no longer knows the job and recorded no end state")
    code = state.exit_code if state.exit_code is not None else 1
    stopped = (run_dir / STOP_REQUEST).exists() and code == EXIT_STOPPED
    if stopped:
        # the engine checkpointed on Slurm's warning and stopped: resumable, like Ctrl-C
        return Exit(code, interrupted=True,
                    reason=f"Slurm's warning signal asked the engine to checkpoint and stop "
                           f"(job state {state.state})")
    if state.state == "COMPLETED" and code == 0:
        return Exit(0)
    if state.state == "TIMEOUT":
        return Exit(code or 1, timed_out=True, reason=MEANING["TIMEOUT"])
    meaning = MEANING.get(state.state, f"the job ended {state.state}")
    detail = f" ({state.reason})" if state.reason else ""
    return Exit(code or 1, reason=f"{meaning}{detail}, exit code {code}"
                + (f", signal {state.signal}" if state.signal else ""))


def orphan_exit(attempt_dir: Path) -> Exit | None:
    """How the job of an attempt whose `run` was killed ended, for the next `run` to record;
    None while the job goes on (or no Slurm client can say). A `run` killed before it
    submitted left nothing that ran."""
    job_file = attempt_dir / "slurm" / "job_id"
    if not job_file.is_file():
        return Exit(1, reason="the `run` process was killed before it submitted the job",
                    started=False)
    job_id = job_file.read_text(encoding="utf-8").strip()
    try:
        state = job_state(job_id)
    except StatesetError:
        return None
    if state is not None and state.state not in ENDED:
        return None
    ended = to_exit(state, attempt_dir, [])
    return Exit(ended.code, interrupted=ended.interrupted, timed_out=ended.timed_out,
                reason=f"Slurm job {job_id} outlived its killed `run`; recorded from how it "
                       "ended: " + (ended.reason or "it completed"))


@dataclass(frozen=True)
class SlurmProvider:
    """An attempt as one batch job; the run directory must be on the shared filesystem."""

    def launch(self, prepared: PreparedLaunch, timeout: float | None) -> Exit:
        problem = never_starts((prepared.run_dir / SCRIPT_FILE).read_text(encoding="utf-8"),
                               _tool("scontrol", "show", "partition", "-o", check=False).stdout)
        if problem is not None:  # it would wait for ever: an attempt that ran nothing
            return Exit(1, reason=problem, started=False)
        try:
            job_id = submit(prepared)
        except Refused as exc:  # an attempt like any other: it ends with its result
            return Exit(1, reason=exc.message, started=False)
        (prepared.run_dir / "slurm" / "job_id").write_text(job_id + "\n")
        announce_submitted(prepared.run_dir, "slurm", job_id)
        print(f"stateset-backend: submitted Slurm job {job_id}", file=sys.stderr, flush=True)
        return follow(job_id, prepared, timeout)


def environment_has_slurm() -> bool:
    return all(shutil.which(t) for t in ("sbatch", "scontrol", "scancel")) and \
        bool(os.environ.get("SLURM_CONF") or Path("/etc/slurm/slurm.conf").exists())
