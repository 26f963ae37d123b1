"""Opening a file someone named: the one way the hub reads a file it did not write.

A spec, a plan or a flag can name anything on the machine: a FIFO blocks whoever opens it
until a writer comes, and a link to ``/dev/zero`` never ends. So such a file is opened without
blocking, refused unless it is a regular file, and read only up to the size it had when it was
opened: every read ends, and its memory is bounded by the caller's block or limit.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


class NotRegularFile(OSError):
    """A path that is not a regular file, or one that changed while it was read; an OSError
    so that every caller reporting "cannot read" reports this too, with its ``strerror``."""


@contextmanager
def open_regular(path: str | os.PathLike[str], limit: int | None = None) -> Iterator[
        tuple[BinaryIO, int]]:
    """(the open file, its size): refused unless a regular file (links followed) of at most
    ``limit`` bytes. Opened with O_NONBLOCK, so a FIFO is refused instead of waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:  # a socket cannot be opened at all: say what it is
        if exc.errno != errno.ENXIO:
            raise
        mode = os.stat(path).st_mode
        raise NotRegularFile(errno.EINVAL, f"is {kind_of(mode)}, not a regular file") from None
    try:
        st = os.fstat(fd)
        mode, size = st.st_mode, st.st_size
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"is {kind_of(mode)}, not a regular file")
        if limit is not None and size > limit:
            raise NotRegularFile(errno.EFBIG, f"is {size:,} bytes, over the limit of "
                                              f"{limit:,} bytes for this file")
        os.set_blocking(fd, True)
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        yield file, size


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes."""
    with open_regular(path, limit) as (file, size):
        data = file.read(size + 1)
    if len(data) > size:
        raise NotRegularFile(errno.EIO, "grew while it was read")
    return data
