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
        from torch.utils.tensorboard.writer import FileWriter

        # the event file SummaryWriter writes, written to directly (see write); a queue that
        # holds many rows: at its default of 10 events, each row waited on the writer thread
        self.writer = FileWriter(str(directory), max_queue=4096, flush_secs=1)

    def write(self, row: dict[str, Any]) -> None:
        """Every finite number of one metrics row at its ``step``, in one event: the values
        ``add_scalar`` writes one event each (a dozen events a row cost more than the row's
        other records together), read back alike by TensorBoard and ``read_scalars``."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=name, simple_value=float(value))
                  for name, value in row.items()
                  if name != "step" and isinstance(value, int | float) and
                  not isinstance(value, bool) and math.isfinite(value)]
        if values:
            self.writer.add_summary(Summary(value=values), int(row["step"]))

    def close(self) -> None:
        self.writer.close()
