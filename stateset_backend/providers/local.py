"""Launch providers: where an engine process runs.

``local`` starts the engine as a child in its own process group (argv list, never a shell),
streams stdout/stderr into files, and on Ctrl-C, SIGTERM or timeout kills the whole group, so
no orphaned trainer keeps a GPU busy after the user thinks the run is over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from stateset_backend.common.display import PlainLog
from stateset_backend.common.errors import EngineFailed

GRACE_SECONDS = 10.0
STDOUT_LOG, STDERR_LOG = "stdout.log", "stderr.log"  # the engine's streams, in its attempt


@dataclass(frozen=True)
class Exit:
    code: int
    interrupted: bool = False
    timed_out: bool = False
    reason: str | None = None  # how the provider saw it end, in words, where it knows more


def _pump(src: IO[bytes], dest: IO[bytes], echo: IO[bytes] | None) -> None:
    """The engine's stream into its log as plain lines (a live bar's redraws and escape codes
    are for the terminal only), and unchanged to the terminal when echoed."""
    log = PlainLog(dest)
    for chunk in iter(lambda: src.read1(65536), b""):  # type: ignore[attr-defined]
        log.write(chunk)
        log.flush()
        if echo is not None:
            echo.write(chunk)
            echo.flush()
    log.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


@contextmanager
def forward_interrupts(on_signal: Any) -> Iterator[None]:
    """While the engine runs, Ctrl-C and SIGTERM stop the engine instead of killing us first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_local(argv: list[str], *, cwd: Path, env: dict[str, str], stdout_path: Path,
              stderr_path: Path, timeout: float | None = None,
              echo_stderr: bool = False) -> Exit:
    """Run one engine process to completion and return how it ended."""
    interrupted = threading.Event()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise EngineFailed(f"cannot start {argv[0]}: {exc.strerror or exc}") from None

    def on_signal(signum: int, frame: Any) -> None:
        interrupted.set()
        _signal_group(proc, signal.SIGTERM)

    echo = sys.stderr.buffer if echo_stderr else None
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err, \
            forward_interrupts(on_signal):
        assert proc.stdout is not None and proc.stderr is not None
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, out, None), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, err, echo), daemon=True)]
        for t in pumps:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        timed_out = False
        stop_sent: float | None = None
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if deadline is not None and now > deadline and not timed_out:
                timed_out = True
                _signal_group(proc, signal.SIGTERM)
            if (interrupted.is_set() or timed_out) and stop_sent is None:
                stop_sent = now
            if stop_sent is not None and now - stop_sent > GRACE_SECONDS:
                _signal_group(proc, signal.SIGKILL)
        # The leader is gone; make sure nothing it started outlives it.
        _signal_group(proc, signal.SIGKILL)
        for t in pumps:
            t.join(timeout=5)
    return Exit(code, interrupted=interrupted.is_set(), timed_out=timed_out)
