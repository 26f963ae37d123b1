"""Staging an earlier attempt's checkpoint into a new attempt (for engines that reload only
from their own output folder): linked where possible, copied elsewhere, never half there, and
the earlier attempt left exactly as it was."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from stateset_backend.engines.adapter import stage_checkpoint


def _checkpoint(root: Path) -> Path:
    source = root / "attempts" / "1" / "checkpoints" / "step_3"
    (source / "policy").mkdir(parents=True)
    (source / "policy" / "weights.pt").write_bytes(b"weights")
    (source / "training_info.json").write_text('{"step": 3}')
    return source


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_staged_checkpoint_is_hard_linked_and_complete(tmp_path):
    source = _checkpoint(tmp_path)
    before = _files(source)
    target = tmp_path / "attempts" / "2" / "checkpoints" / "step_3"
    stage_checkpoint(source, target)
    assert _files(target) == before == _files(source)
    weights = "policy/weights.pt"
    assert (target / weights).stat().st_ino == (source / weights).stat().st_ino
    assert not list(target.parent.glob("*.staging"))


def test_across_filesystems_the_checkpoint_is_copied(tmp_path, monkeypatch):
    source = _checkpoint(tmp_path)

    def no_links(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "other" / "step_3"
    stage_checkpoint(source, target)
    assert _files(target) == _files(source)
    weights = "policy/weights.pt"
    assert (target / weights).stat().st_ino != (source / weights).stat().st_ino
