"""The tether: the engine's process group ends with the ``run`` process that started it.

``run`` stops its engine on Ctrl-C, SIGTERM and its timeout, but a supervisor that kills
``run`` outright (SIGKILL from a CI runner's timeout, a scheduler's pre-emption, the OOM
killer) gives it no chance to, and a trainer left behind keeps a GPU busy and writes into an
attempt that nobody will record. No signal handler can see SIGKILL, so the watcher has to be
another process: this one, started right after the engine, in a session of its own (a
terminal's Ctrl-C and a ``killpg`` of the CLI's group both pass it by). Its stdin is the read
end of a pipe whose write end only ``run`` holds; the kernel closes that end however ``run``
dies, so the tether reads EOF exactly when ``run`` is gone, without polling. It then stops
the engine's whole group (SIGTERM, SIGKILL after a grace period) and runs the command it was
given to record what the attempt committed. ``run`` ending the attempt itself writes a byte
first: the tether leaves quietly, so none accumulate.

The module imports the standard library only: it runs as ``python -m`` for the whole length of
every local run, and a tether that took seconds to start would leave the very window open
that it closes.

The same file also carries the lock by which an attempt shows that its ``run`` process is
alive (``hold``/``claim``): a lock the kernel releases when its holder dies is the one record
of liveness that SIGKILL cannot leave stale.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

DISARM = b"x"  # what `run` writes when it has ended the attempt itself
POLL_SECONDS = 0.05


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is still running. A zombie counts as gone: once
    ``run`` is dead, the leader's new parent (often a container's PID 1) may never reap it,
    and waiting for that would only delay the recording."""
    proc = Path("/proc")
    if sys.platform.startswith("linux") and proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # after the command's closing parenthesis: state, ppid, pgrp, ...
            fields = stat[stat.rfind(")") + 2:].split()
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, grace: float) -> str:
    """SIGTERM to the whole group, SIGKILL to what is left after ``grace`` seconds; how it
    went, in words."""
    if not group_alive(pgid):
        return "the engine's process group had already ended"
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_alive(pgid):
        if time.monotonic() > deadline:
            with suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return f"the engine's process group was stopped (SIGKILL after {grace:g}s)"
        time.sleep(POLL_SECONDS)
    return "the engine's process group was stopped (SIGTERM)"


def wait_for_release(fd: int) -> bool:
    """Block until ``run`` disarms the tether (True) or dies (EOF, False)."""
    while True:
        try:
            return bool(os.read(fd, 1))
        except InterruptedError:
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stateset_backend.providers.tether")
    parser.add_argument("--group", type=int, required=True, help="the engine's process group")
    parser.add_argument("--grace", type=float, required=True)
    parser.add_argument("--log", help="where to say what was done once `run` is gone")
    parser.add_argument("then", nargs=argparse.REMAINDER,
                        help="-- COMMAND: run once the group has ended, in the tether's place")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only `run` decides to stop its engine
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if wait_for_release(0):
        return 0
    done = stop_group(args.group, args.grace)
    then = args.then[1:] if args.then[:1] == ["--"] else args.then
    if args.log:
        with suppress(OSError):
            fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
    with suppress(OSError):
        os.write(2, f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} the `run` "
                    f"process ended without stopping its engine; {done}\n".encode())
    if then:
        os.execvp(then[0], then)  # the recording, in this process's place
    return 0


# -- the attempt's liveness lock: held by `run` while the attempt is its own --

@contextmanager
def hold(path: Path, record: dict[str, Any]) -> Iterator[None]:
    """Hold ``path`` locked for as long as the block runs, with ``record`` as its content
    (what a later reader needs to record the attempt, should its holder die); the file goes
    when the block ends."""
    import fcntl

    from stateset_backend.common.jsonio import atomic_write_json

    atomic_write_json(path, record)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with suppress(OSError):
            path.unlink()
        os.close(fd)  # releases the lock


@contextmanager
def claim(path: Path, wait: float = 0.0) -> Iterator[dict[str, Any] | None]:
    """The record of a holder that is gone, locked for this block; None when there is no
    such record or its holder still runs (``wait`` seconds of retrying let a reader that only
    looked at the lock pass). The caller checks again, under the lock, that the work it would
    do is not done: another reader may have claimed it first."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    yield None
                    return
                time.sleep(POLL_SECONDS)
        try:
            record = json.loads(os.read(fd, 1 << 20) or b"{}")
        except ValueError:
            record = {}
        yield record if isinstance(record, dict) else {}
    finally:
        os.close(fd)


def held(path: Path) -> bool:
    """Whether a live process holds ``path`` (False when there is no such file)."""
    with claim(path) as record:
        return record is None and path.exists()


if __name__ == "__main__":
    sys.exit(main())
