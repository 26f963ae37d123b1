"""Content digests of files and directories, the identity of data, rewards and local models."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

from stateset_backend.common.reading import NotRegularFile, open_regular

BLOCK = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Lower-case hex SHA-256 of a regular file's bytes, read in blocks up to the size it had
    when opened; a file still being written (it grows meanwhile) has no digest yet."""
    h = hashlib.sha256()
    with open_regular(path) as (file, size):
        left = size
        while left > 0:
            block = file.read(min(BLOCK, left))
            if not block:
                raise NotRegularFile(errno.EIO, "shrank while it was read")
            h.update(block)
            left -= len(block)
        if file.read(1):
            raise NotRegularFile(errno.EIO, "grew while it was read")
    return h.hexdigest()


def directory_digest(root: str | os.PathLike[str]) -> str:
    """``sha256:`` of the canonical JSON map {relative path: file sha256} of a directory.

    This is what ``model.revision`` holds for a local model directory: renaming, adding,
    removing or changing any file changes it; file times and order do not.
    """
    from stateset_backend.spec.digest import sha256_of  # with the spec's models: not for a file

    base = Path(root)
    files = {p.relative_to(base).as_posix(): sha256_file(p)
             for p in sorted(base.rglob("*")) if p.is_file()}
    return sha256_of(files)
