"""Strict JSON reading and atomic writing.

Reading is strict because a silently-accepted NaN or a duplicated key is exactly the kind of
input that turns into a wasted GPU-day; writing is atomic because a half-written plan or
result is worse than none.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.reading import read_regular

# A spec, plan, result or record is settings and bookkeeping, never bulk data; a file past this
# is a mistake (or a device) that would otherwise be read whole into memory.
MAX_JSON_BYTES = 64 << 20


def utc_now() -> str:
    """The timestamp every record the hub writes carries: UTC, to the second, ISO 8601."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (non-finite numbers are rejected)")


def _finite_float(text: str) -> float:
    """A number literal too large for a double (``1e400``) parses to infinity; refused here so
    no infinity reaches a digest, a plan or an engine."""
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text} is too large to be carried exactly "
                         "(non-finite numbers are rejected)")
    return number


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise ValueError(f"key {key!r} appears twice in one object")
        doc[key] = value
    return doc


def loads(text: str, *, source: str = "<input>") -> Any:
    """Parse JSON, rejecting NaN/Infinity and duplicate keys, with line and column on error."""
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                          object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        # json's messages end in " at" before the place it appends to them, given here first
        raise InvalidInput(f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: "
                           f"{exc.msg.removesuffix(' at')}") from None
    except ValueError as exc:
        raise InvalidInput(f"{source}: {exc}") from None
    except RecursionError:
        raise InvalidInput(f"{source}: nested too deeply to be a spec, plan or contract") \
            from None


def read_json(path: str | os.PathLike[str], *, what: str = "file") -> Any:
    """Read a JSON document from disk; every way it can be unusable is one InvalidInput."""
    p = Path(path)
    if not p.exists():
        raise InvalidInput(f"{p}: no such {what}")
    if p.is_dir():
        raise InvalidInput(f"{p}: is a directory, expected a JSON {what}")
    try:
        raw = read_regular(p, MAX_JSON_BYTES)
    except OSError as exc:
        raise InvalidInput(f"{p}: cannot read: {exc.strerror}") from None
    if not raw.strip():
        raise InvalidInput(f"{p}: is empty, expected a JSON {what}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{p}: not UTF-8 text (byte {exc.start})") from None
    return loads(text, source=str(p))


def log_rows(text: str) -> list[Any]:
    """The rows of a JSON-lines log an engine appends to as it trains. A last line without its
    newline that does not parse is the row a process was killed while writing: it is left
    out, and every row before it stands (an attempt's metrics survive its crash). Any other
    line that does not parse raises ValueError: that log is damaged, not cut."""
    lines = text.split("\n")
    rows = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            if index == len(lines) - 1:  # no newline after it: cut off mid-write
                break
            raise
    return rows


def dumps(doc: Any) -> str:
    """Readable, stable JSON for files humans review (plans, results)."""
    return json.dumps(doc, indent=2, sort_keys=False, allow_nan=False) + "\n"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *,
                       durable: bool = True) -> None:
    """Write via temp file in the same directory, fsync, rename: readers see all or nothing.

    ``durable=False`` skips the two fsyncs: still all or nothing for every reader and after a
    crash of the writer, but a power loss may bring back the previous version. For progress
    records rewritten every update, whose durable copy is written at each checkpoint.

    The rename replaces a directory entry, so it is only right for regular files: ``-o
    /dev/null`` or a named pipe renamed over would turn the device into a plain file (as root,
    for every process on the machine), and a symlink would be replaced by a copy. A symlink is
    followed to its file; anything else that exists and is not a regular file is written in
    place, as a stream, which is all such a target can be."""
    target = Path(path)
    try:
        found = os.stat(target)  # follows symlinks: /dev/stdout is a link to a pipe
    except FileNotFoundError:
        found = None
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(target))
    if found is not None and not stat.S_ISREG(found.st_mode):
        with open(target, "wb") as fh:
            fh.write(data)
        return
    if target.is_symlink():
        target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp's 0600 would make plans, results and reports unreadable to the team that
        # shares a run store: give the file the mode a plain open() would (umask applies).
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not durable:
        return
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: str | os.PathLike[str], doc: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, dumps(doc).encode("utf-8"), durable=durable)


def put(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set the dotted ``path`` of nested dicts to ``value``, making the mappings on the way
    (flatten's inverse, one key at a time); returns ``doc``."""
    node = doc
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return doc


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists, empty dicts and scalars are leaves."""
    if isinstance(doc, dict) and doc:
        out: dict[str, Any] = {}
        for key, value in doc.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: doc}
