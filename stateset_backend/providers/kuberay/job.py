"""Applying an attempt's RayJob with kubectl and following it to its end.

kubectl is the one client every Kubernetes user already has, configured for their cluster
(context, credentials, namespace access); the provider drives it with machine-readable output
only: ``kubectl apply --validate=strict -f`` (the API server refuses unknown fields, as the
offline check does), ``kubectl get rayjob NAME -o json`` for ``status.jobDeploymentStatus`` /
``status.jobStatus`` / ``status.reason``, and ``kubectl delete rayjob`` when Ctrl-C, SIGTERM or
the run's timeout stops the attempt (the RayCluster goes with it). The engine writes its
outputs into the attempt's folder on the shared volume; the job's logs (Ray merges the driver's
two streams) are fetched from the submitter once it ended.
"""

from __future__ import annotations

import json
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

from stateset_backend.common.errors import EngineFailed, Unsupported
from stateset_backend.providers.base import (
    PreparedLaunch,
    announce_submitted,
    cancelled_exit,
)
from stateset_backend.providers.local import Exit, forward_interrupts

POLL_SECONDS = 5.0
MAX_READ_FAILURES = 12  # consecutive `kubectl get` failures before the attempt is given up
ENDED = frozenset({"Complete", "Failed", "ValidationFailed", "Suspended"})
STOPPED_CODE = -int(signal.SIGTERM)  # as the ray provider records a job stopped elsewhere
_EXIT_CODE = re.compile(r"exit code (-?\d+)")
KUBECTL_MISSING = ("kubectl is not on PATH: install it (https://kubernetes.io/docs/tasks/tools/) "
                   "and point it at the cluster (KUBECONFIG, or the current context)")


@dataclass(frozen=True)
class RayJobState:
    deployment: str  # status.jobDeploymentStatus
    job: str  # status.jobStatus
    reason: str = ""
    message: str = ""

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> RayJobState:
        return cls(str(status.get("jobDeploymentStatus") or ""),
                   str(status.get("jobStatus") or ""), str(status.get("reason") or ""),
                   str(status.get("message") or ""))

    def describe(self) -> str:
        said = f", reason {self.reason}" if self.reason else ""
        return f"{self.deployment or 'New'} (job {self.job or 'PENDING'}{said})"


def require_kubectl() -> None:
    if shutil.which("kubectl") is None:
        raise Unsupported(KUBECTL_MISSING)


def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    require_kubectl()
    done = subprocess.run(["kubectl", *args], capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        lines = [" ".join(line.split()) for line in (done.stderr or done.stdout).splitlines()]
        said = "; ".join(dict.fromkeys(line for line in lines if line))  # each line once
        raise EngineFailed(f"kubectl {args[0]} failed ({done.returncode})"
                           + (f": {said}" if said else ""))
    return done


def apply(manifest: Path) -> None:
    kubectl("apply", "--validate=strict", "-f", str(manifest))


def read_state(name: str, namespace: str) -> RayJobState | str | None:
    """The RayJob's state; None when it does not exist; the error line when kubectl failed."""
    done = kubectl("get", "rayjob", name, "-n", namespace, "-o", "json", check=False)
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip()
        if "NotFound" in text or "not found" in text:
            return None
        return text.splitlines()[-1] if text else f"kubectl get exited {done.returncode}"
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return "kubectl get printed no JSON"
    status = doc.get("status") if isinstance(doc, dict) else None
    return RayJobState.from_status(status if isinstance(status, dict) else {})


def to_exit(state: RayJobState | None, cancelled_by: list[str], problem: str = "") -> Exit:
    """The attempt's end, from the RayJob's end state (see docs/providers/kuberay.md)."""
    if cancelled_by:
        return cancelled_exit(cancelled_by[0], "deleted the RayJob")
    if state is None:
        return Exit(1, reason=problem or "the RayJob was deleted before it ended")
    said = f": {state.message}" if state.message else ""
    if state.deployment == "Complete" and state.job == "SUCCEEDED":
        return Exit(0)
    if state.reason == "DeadlineExceeded":
        return Exit(124, timed_out=True, reason=f"KubeRay ended the RayJob at its "
                                                f"activeDeadlineSeconds{said}")
    if state.deployment == "Suspended":
        return Exit(STOPPED_CODE, reason=f"the RayJob was suspended outside this run{said}")
    if state.job == "STOPPED":
        return Exit(STOPPED_CODE, reason=f"the Ray job was stopped outside this run{said}")
    if state.deployment == "ValidationFailed" or state.reason == "ValidationFailed":
        return Exit(1, reason=f"KubeRay refused the RayJob{said}", started=False)
    if state.reason == "SubmissionFailed":
        return Exit(1, reason=f"KubeRay could not submit the job{said}", started=False)
    if state.job == "FAILED":
        found = _EXIT_CODE.search(state.message)
        return Exit(int(found.group(1)) if found else 1, reason=f"the Ray job failed{said}")
    return Exit(1, reason=f"the RayJob ended {state.describe()}{said}")


@dataclass(frozen=True)
class KubeRayProvider:
    """An attempt as one RayJob; its folder is on the volume the pods mount."""

    manifest: Path  # the attempt's rayjob.yaml
    name: str
    namespace: str
    submission_mode: str = "K8sJobMode"

    def launch(self, prepared: PreparedLaunch, timeout: float | None) -> Exit:
        try:
            apply(self.manifest)
        except EngineFailed as exc:  # unreachable cluster, refused manifest: the attempt says so
            # kubectl's words once: the result's error line reads them from stderr.log
            prepared.stderr_path.write_text(f"kubectl apply error: {exc.message}\n",
                                            encoding="utf-8")
            return Exit(1, reason="the RayJob was not created", started=False)
        announce_submitted(prepared.run_dir, "kuberay", f"{self.namespace}/{self.name}")
        if prepared.echo_stderr:
            print(f"stateset-backend: applied RayJob {self.namespace}/{self.name}; following "
                  f"it (kubectl get rayjob {self.name} -n {self.namespace})", file=sys.stderr,
                  flush=True)
        state, cancelled_by, problem = self._follow(prepared.echo_stderr, timeout)
        self._keep_logs(prepared, state)
        return to_exit(state, cancelled_by, problem)

    def _follow(self, echo: bool, timeout: float | None,
                ) -> tuple[RayJobState | None, list[str], str]:
        stop = threading.Event()
        cancelled_by: list[str] = []

        def on_signal(signum: int, frame: Any) -> None:
            cancelled_by.append(signal.Signals(signum).name)
            stop.set()

        deadline = None if timeout is None else time.monotonic() + timeout
        state: RayJobState | None = None
        failures, shown = 0, ""
        with forward_interrupts(on_signal):
            while True:
                got = read_state(self.name, self.namespace)
                if isinstance(got, str):
                    failures += 1
                    if failures >= MAX_READ_FAILURES:
                        return state, [], f"cannot read the RayJob: {got}"
                elif got is None:
                    return None, [], ("the RayJob was deleted before it ended" if state else
                                      "the RayJob is not in the cluster after kubectl apply")
                else:
                    failures, state = 0, got
                    if echo and state.describe() != shown:
                        shown = state.describe()
                        print(f"stateset-backend: RayJob {self.name}: {shown}", file=sys.stderr,
                              flush=True)
                    if state.deployment in ENDED:
                        return state, [], ""
                if deadline is not None and time.monotonic() > deadline and not stop.is_set():
                    cancelled_by.append("timeout")
                    stop.set()
                if stop.is_set():
                    kubectl("delete", "rayjob", self.name, "-n", self.namespace,
                            "--ignore-not-found", "--wait=false", check=False)
                    return state, cancelled_by, ""
                stop.wait(POLL_SECONDS)

    def _keep_logs(self, prepared: PreparedLaunch, state: RayJobState | None) -> None:
        """The job's logs into stdout.log; how it ended, after the logs' tail, into stderr.log
        (where a failed result's error line is read from)."""
        logs = ""
        if self.submission_mode == "K8sJobMode":
            done = kubectl("logs", "-n", self.namespace, f"job/{self.name}", "--tail=-1",
                           check=False)
            logs = done.stdout if done.returncode == 0 else \
                f"(no logs: kubectl logs job/{self.name}: {done.stderr.strip()})\n"
        else:
            logs = (f"(in {self.submission_mode} the job's logs are on the head pod: kubectl "
                    f"exec into it and run `ray job logs`)\n")
        prepared.stdout_path.write_text(logs, encoding="utf-8")
        end = "no end state" if state is None else state.describe() + \
            (f": {state.message}" if state.message else "")
        tail = "".join(line + "\n" for line in logs.splitlines()[-200:])
        prepared.stderr_path.write_text(f"{tail}RayJob {self.namespace}/{self.name}: {end}\n",
                                        encoding="utf-8")
