"""The ``ray`` launch provider: run the engine as a Ray job through the Jobs API.

Where compute comes from is a separate choice from which engine trains: the same plan runs
as a local process group or as a job on a Ray cluster. The job's entrypoint is the plan's
argv, shell-quoted word by word (Ray takes one command string), its environment is the plan's
``set_env``, and its submission id carries the run id and attempt so the job is findable in
Ray's own dashboard. Ctrl-C, SIGTERM and the timeout stop the job on the cluster.

Outputs go where the plan's paths point, so the attempt directory must be reachable from the
cluster's workers (the same machine, or a shared filesystem).

A cluster with Ray's token authentication (its secure setup for shared clusters) wants the
token on every request. Ray's own client sends it only when ``RAY_AUTH_MODE=token`` is set in
this process, while ``ray start`` switches a head to token mode as soon as a token file exists:
a user with ``~/.ray/auth_token`` would be refused by their own cluster. So the token is read
here the way Ray reads it (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``)
and sent as a request header only: never into the plan, the job's environment or a log.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import threading
import time
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.providers.local import Exit, forward_interrupts

POLL_SECONDS = 0.5
_EXIT_CODE = re.compile(r"exit code (-?\d+)")
TOKEN_FIX = ("put the cluster's token in RAY_AUTH_TOKEN or ~/.ray/auth_token (`ray "
             "get-auth-token` on the cluster's head prints it)")


def auth_token() -> tuple[str, str] | None:
    """(token, where it came from) as Ray itself looks for it, or None; an explicit
    ``RAY_AUTH_MODE=disabled`` means the user wants none sent."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return (token, str(path)) if token else None


def _refusal(address: str, exc: Exception, token_from: str | None) -> str:
    """One line for a refused submission: a missing or refused token names where a token
    goes (Ray's own message spans paragraphs and names a setting that does not help here)."""
    text = str(exc)
    if "Authentication required" in text or "Missing authentication token" in text:
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
            return (f"the Ray cluster at {address} requires token authentication and "
                    f"RAY_AUTH_MODE=disabled sends no token: unset it and {TOKEN_FIX}")
        return (f"the Ray cluster at {address} requires token authentication and no token "
                f"was found: {TOKEN_FIX}")
    if "Authentication failed" in text or "Invalid authentication token" in text:
        return (f"the Ray cluster at {address} refused the token from {token_from}: "
                f"{TOKEN_FIX}")
    first = " ".join(text.split())
    return f"cannot submit to the Ray cluster at {address}: {first}"


def run_ray(argv: list[str], *, address: str | None, env: dict[str, str], submission_id: str,
            stdout_path: Path, stderr_path: Path, timeout: float | None = None) -> Exit:
    try:
        from ray.job_submission import JobStatus, JobSubmissionClient
    except ImportError:
        raise InvalidInput("the ray provider needs ray: pip install 'stateset-backend[ray]'") \
            from None
    if not address:
        raise InvalidInput("the ray provider needs --ray-address (or RAY_ADDRESS), e.g. "
                           "http://127.0.0.1:8265")
    token = auth_token()
    headers = {"Authorization": f"Bearer {token[0]}"} if token else None
    try:
        client = JobSubmissionClient(address, headers=headers)
        job_id = client.submit_job(entrypoint=shlex.join(argv), submission_id=submission_id,
                                   runtime_env={"env_vars": env})
    except Exception as exc:  # connection refused, bad address, refused token, rejected job
        # nothing ran, and the attempt says why in its result like any other
        return Exit(1, reason=_refusal(address, exc, token[1] if token else None),
                    started=False)

    interrupted = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        interrupted.set()

    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    with forward_interrupts(on_signal):
        stop_sent = False
        while True:
            info = client.get_job_info(job_id)
            if info.status in terminal:
                break
            late = deadline is not None and time.monotonic() > deadline
            if (interrupted.is_set() or late) and not stop_sent:
                timed_out = late and not interrupted.is_set()
                client.stop_job(job_id)
                stop_sent = True
            time.sleep(POLL_SECONDS)
    stdout_path.write_text(client.get_job_logs(job_id), encoding="utf-8")
    stderr_path.write_text(f"ray job {job_id}: {info.status} {info.message or ''}\n",
                           encoding="utf-8")
    if info.status == JobStatus.SUCCEEDED:
        code = 0
    elif info.status == JobStatus.STOPPED:
        code = 130 if interrupted.is_set() else -int(signal.SIGTERM)
    else:
        found = _EXIT_CODE.search(info.message or "")
        code = int(found.group(1)) if found else 1
    return Exit(code, interrupted=interrupted.is_set(), timed_out=timed_out)
