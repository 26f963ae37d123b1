"""Launch providers: where an engine process runs.

``local`` starts the engine as a child in its own process group (argv list, never a shell),
streams stdout/stderr into files, and on Ctrl-C, SIGTERM or timeout kills the whole group, so
no orphaned trainer keeps a GPU busy after the user thinks the run is over. What ``run``
cannot catch (SIGKILL, the OOM killer) the tether (providers/tether.py) answers: it stops the
group once ``run`` is gone and runs the command the caller gave to record the attempt. The
engine's leader also gets SIGTERM from the kernel when ``run`` dies (Linux's parent-death
signal), for the instant before the tether is up.
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
from stateset_backend.providers import tether as tether_module

GRACE_SECONDS = 10.0
# once `run` is gone nobody waits for the engine's own clean stop, and a machine taken back by
# its scheduler is wanted back at once
ORPHAN_GRACE_SECONDS = 5.0
STDOUT_LOG, STDERR_LOG = "stdout.log", "stderr.log"  # the engine's streams, in its attempt
ORPHANED_LOG = "orphaned.log"  # written only when `run` died first: what the tether did
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Exit:
    code: int
    interrupted: bool = False
    timed_out: bool = False
    reason: str | None = None  # how the provider saw it end, in words, where it knows more
    # False when the engine never started (a submission refused, a launcher that is not
    # there): no exit code of the engine's exists, and the attempt says why it never began
    started: bool = True


class NotStarted(EngineFailed):
    """The engine's process could not be started at all."""


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


def _dies_with_parent() -> Any:
    """A preexec function giving the engine's leader SIGTERM when the thread that starts it
    ends, its process dying included (the first step the tether takes too, so an engine's own
    clean stop still runs; run_local's thread waits for the engine, so it never ends first on
    a normal path); None where the kernel has no parent-death signal."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, sig = os.getpid(), int(signal.SIGTERM)

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # died between fork and prctl: the signal would never come
            os.kill(os.getpid(), sig)

    return arm


def _start_tether(group: int, on_orphaned: list[str] | None,
                  log: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """The tether of ``group`` and the write end of its pipe, which only this process holds
    (os.pipe's ends are close-on-exec, and every child here is started with close_fds).
    None when it cannot start: the engine then has the parent-death signal alone."""
    read, write = os.pipe()
    try:
        return subprocess.Popen(
            [sys.executable, "-I", tether_module.__file__, "--group", str(group),
             "--grace", str(ORPHAN_GRACE_SECONDS), "--log", str(log), "--",
             *(on_orphaned or [])],
            stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=True), write
    except OSError:
        os.close(write)
        return None
    finally:
        os.close(read)


def _release_tether(tether: tuple[subprocess.Popen[bytes], int] | None) -> None:
    """Tell the tether that this process ended the engine itself, and reap it."""
    if tether is None:
        return
    proc, write = tether
    with suppress(OSError):
        os.write(write, tether_module.DISARM)
    os.close(write)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_local(argv: list[str], *, cwd: Path, env: dict[str, str], stdout_path: Path,
              stderr_path: Path, timeout: float | None = None,
              echo_stderr: bool = False, on_orphaned: list[str] | None = None) -> Exit:
    """Run one engine process to completion and return how it ended. ``on_orphaned`` is the
    command the tether runs, after stopping the engine, when this process dies first."""
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=_dies_with_parent())
    except OSError as exc:
        raise NotStarted(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    tether = _start_tether(proc.pid, on_orphaned, stderr_path.with_name(ORPHANED_LOG))
    try:
        return _follow(proc, stdout_path, stderr_path, timeout, echo_stderr)
    finally:
        if proc.poll() is None:  # raised while it ran: it must not outlive the tether either
            _signal_group(proc, signal.SIGKILL)
        _release_tether(tether)


def _follow(proc: subprocess.Popen[bytes], stdout_path: Path, stderr_path: Path,
            timeout: float | None, echo_stderr: bool) -> Exit:
    """Stream the engine's output, stop its group on a signal or the timeout, and wait for
    it to end."""
    interrupted = threading.Event()

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
