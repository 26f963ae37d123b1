"""TensorBoard event files beside ``metrics.jsonl``, so ``tensorboard --logdir runs/`` shows any
native run. ``metrics.jsonl`` stays the source of truth (results and reports read it); the
event files are a view of the same rows, written by TensorBoard's own writer and flushed by its
background thread every second (not each update: a flush each update waited on that thread and
cost a small model a tenth of its update), so a crashed run still shows its curves. They are
not artifacts: nothing is hashed or checked from them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


class ScalarLog:
    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # a queue that holds many rows: at its default of 10 events, each row of ~40 scalars
        # waited on the writer thread
        self.writer = SummaryWriter(log_dir=str(directory), flush_secs=1, max_queue=4096)

    def write(self, row: dict[str, Any]) -> None:
        """Every finite number of one metrics row at its ``step``."""
        step = int(row["step"])
        for name, value in row.items():
            if name != "step" and isinstance(value, int | float) and \
                    not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(name, float(value), step)

    def close(self) -> None:
        self.writer.close()
