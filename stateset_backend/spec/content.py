"""Content digests of files and directories, the identity of data, rewards and local models."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Lower-case hex SHA-256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
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
