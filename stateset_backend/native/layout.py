"""Where the native engine writes inside an attempt directory.

Torch-free on purpose: the adapter reads these paths (to collect results and find
checkpoints) without importing the engine.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "native_config.json"
RUN_INFO_FILE = "run_info.json"
METRICS_FILE = "metrics.jsonl"
RECEIPTS_FILE = "receipts.jsonl"
TRAJECTORIES_DIR = "trajectories"
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
