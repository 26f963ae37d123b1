"""Whether a weights file an engine left is whole.

An engine killed while it saves leaves a checkpoint or final model whose file exists, is listed
by its collector and hashes without complaint: a zero-byte file, or a safetensors or torch file
cut short. The result check refuses those. It judges only what a file's own format proves (a
safetensors header that declares more bytes than the file holds, a ``torch.save`` zip archive
without its central directory), so a file in a format the hub cannot read is never called
broken.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

WEIGHT_SUFFIXES = frozenset({".safetensors", ".pt", ".pth", ".bin", ".ckpt"})
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on its JSON header
_ZIP_ENTRY = b"PK\x03\x04"


def _safetensors_problem(path: Path, size: int) -> str | None:
    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if size < 8 or not 2 <= length <= _MAX_HEADER:
            return None  # not a safetensors header: not the hub's to judge
        header = f.read(min(length, size - 8))
    if header and not header.startswith(b"{"):
        return None  # eight bytes that only look like a length: not a header
    if 8 + length > size:
        return f"cut short: its header alone needs {8 + length} bytes, the file has {size}"
    try:
        tensors = json.loads(header)
        end = max((int(t["data_offsets"][1]) for k, t in tensors.items()
                   if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    if 8 + length + end > size:
        return f"cut short: its header declares {8 + length + end} bytes, the file has {size}"
    return None


def problem(path: Path) -> str | None:
    """Why the weights file at ``path`` is not whole; None where it is, or where it is not a
    weights file the hub can read."""
    if path.suffix not in WEIGHT_SUFFIXES:
        return None
    size = path.stat().st_size
    if size == 0:
        return "empty (0 bytes)"
    if path.suffix == ".safetensors":
        return _safetensors_problem(path, size)
    with path.open("rb") as f:
        zipped = f.read(4) == _ZIP_ENTRY  # torch.save's archive opens with its first entry
    if zipped and not zipfile.is_zipfile(path):
        return "cut short: a torch.save zip archive without its end (central directory)"
    return None
