"""Where the native engine writes inside an attempt directory.

Torch-free on purpose: the adapter reads these paths (to collect results and find
checkpoints) without importing the engine. The checkpoint manifest and runtime record are
also public (``stateset_backend.plugin``), for plugins whose launch seals its engine's
checkpoints the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIG_FILE = "native_config.json"
RUN_INFO_FILE = "run_info.json"
METRICS_FILE = "metrics.jsonl"
RECEIPTS_FILE = "receipts.jsonl"
TRAJECTORIES_DIR = "trajectories"
TENSORBOARD_DIR = "tensorboard"  # event files mirroring metrics.jsonl; not artifacts
CHECKPOINTS_DIR = "checkpoints"
FINAL_DIR = "final"
MANIFEST = "manifest.json"
CHECKPOINT_PREFIX = "update-"


def checkpoint_name(update: int) -> str:
    return f"{CHECKPOINT_PREFIX}{update:06d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories that have a manifest (written last), oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and
                  p.name.startswith(CHECKPOINT_PREFIX) and (p / MANIFEST).is_file())


def manifest_problem(directory: Path, experiment_digest: str) -> str | None:
    """What is wrong with a checkpoint, checked against its manifest without loading it (so
    the CLI can refuse a resume without importing torch), or None when it is whole."""
    import hashlib
    import json

    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return f"{manifest_path}: missing (the checkpoint is incomplete)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files listed")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{manifest_path}: unreadable ({type(exc).__name__}: {exc})"
    if manifest.get("experiment_digest") != experiment_digest:
        return (f"{manifest_path}: belongs to experiment {manifest.get('experiment_digest')}, "
                f"not {experiment_digest}")
    for name, digest in sorted(files.items()):
        path = directory / name
        if path.is_symlink() or not path.is_file():
            return f"{path}: missing"
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != digest:
            return f"{path}: its content does not match the manifest (damaged or truncated)"
    return None


RUNTIME_FILE = "runtime.json"  # inside each checkpoint, listed in its manifest
RUNTIME_PACKAGES = ("torch", "transformers", "stateset-backend")


def runtime_identity(spec: Any, world_size: int, versions: dict[str, str | None],
                     ranks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What a checkpoint records about how it was computed (runs.runtime compares it on
    resume): the world size, the model it started from, the package versions, and each rank's
    data position (the shared sampler's state and the block of groups the rank held)."""
    doc: dict[str, Any] = {
        "world_size": world_size,
        "model": {"path": spec.model.path, "revision": spec.model.revision},
        "versions": versions}
    if ranks is not None:
        doc["ranks"] = ranks
    return doc


def read_runtime(directory: Path) -> dict[str, Any] | None:
    """A checkpoint's recorded runtime, or None for one written before runtimes were."""
    import json

    path = directory / RUNTIME_FILE
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    return doc if isinstance(doc, dict) else None
